"""A tiny Qwen3 whose greedy output follows a script: a reasoning model you control.

The tokenizer is a small byte-level BPE (trained here) with Qwen's chat
markers and ``<think>`` / ``</think>`` as added tokens, and a Qwen3-style chat
template (``enable_thinking=False`` writes an empty, closed think block). The
model's layers add nothing (their output projections are zero), so the logits
depend only on the current token: ``lm_head`` maps each token of a script to the
next one, and greedy decoding writes the script out. A constraint (a grammar)
that bans the script's next token lets the model pick among the others.
"""

from __future__ import annotations

import json
import os

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}\n<think>\n\n</think>"
    "{%- else %}\n{% endif %}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
# The output of a thinking turn and of a turn whose prompt closed the block.
THOUGHT = "Let me think"
ANSWER = "Hello world"
SCRIPT = f"<think>{THOUGHT}</think>{ANSWER}"
CORPUS = ["user assistant system Hello world Let me think about it.\n\n" * 4,
          '{"answer": "yes"} {"answer": "no"} [{"name": "f", "parameters": {}}]'] * 3


def make_tokenizer():
    """The tiny byte-level BPE tokenizer with the Qwen3-style chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _chain(tok) -> dict[int, int]:
    """token -> next token: the prompt's last token starts the script, which ends in EOS."""
    def last(**kw):
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True, **kw)
        return tok.encode(text, add_special_tokens=False)[-1]

    ids = [last()] + tok.encode(SCRIPT, add_special_tokens=False) + [tok.eos_token_id]
    closed_end = last(enable_thinking=False)
    nxt: dict[int, int] = {}
    for a, b in zip(ids, ids[1:]):
        if nxt.setdefault(a, b) != b:
            raise AssertionError(f"token {a} repeats in the script; change SCRIPT or CORPUS")
    if nxt.get(closed_end) != tok.encode(ANSWER, add_special_tokens=False)[0]:
        raise AssertionError("the thinking-off prompt must end where the answer starts")
    return nxt


def build_reasoning_model(folder: str, seed: int = 0) -> str:
    """Save the tokenizer and the scripted Qwen3 into ``folder``; returns it."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = make_tokenizer()
    nxt = _chain(tok)
    hidden = 64
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
                      eos_token_id=tok.eos_token_id, bos_token_id=None,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        emb.normal_(0.0, 1.0)
        chain = sorted(set(nxt) | set(nxt.values()))
        q, _ = torch.linalg.qr(torch.randn(hidden, hidden))
        for i, t in enumerate(chain):  # script tokens: orthogonal directions
            emb[t] = q[:, i % hidden]
        head = model.lm_head.weight
        head.normal_(0.0, 0.01)
        for a, b in nxt.items():
            head[b] += 20.0 * emb[a] / (emb[a].norm() * hidden ** 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tok.eos_token_id}, f)
    return folder
