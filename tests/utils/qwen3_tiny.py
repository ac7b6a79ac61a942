"""A tiny random Qwen3 (HF folder) with the small Qwen-style tokenizer of
``reasoning_model``: for checks against transformers (scores, pooled states)."""

from __future__ import annotations


def build_random_qwen3(folder: str, seed: int = 0) -> str:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.utils.reasoning_model import make_tokenizer

    tok = make_tokenizer()
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the default init: scores far from 0.5
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder
