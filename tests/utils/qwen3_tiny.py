"""A tiny random Qwen3 (HF folder) with the small Qwen-style tokenizer of
``reasoning_model``, and transformers' references on it: pooled hidden states
(``hf_embed``) and yes/no reranker scores (``hf_scores``)."""

from __future__ import annotations

import numpy as np


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


def hf_embed(path: str, texts, pooling: str, dims=None) -> list[np.ndarray]:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for t in texts:
            ids = tok(t, return_tensors="pt", add_special_tokens=False)
            h = model(**ids).last_hidden_state[0]
            v = h[-1] if pooling == "last" else h.mean(0)
            v = v[:dims] if dims else v
            out.append((v / v.norm()).numpy())
    return out


def hf_scores(path: str, pairs, instruction=None) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pagedjax.entrypoints.scoring import rerank_prompt

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    out = []
    with torch.no_grad():
        for q, d in pairs:
            ids = tok(rerank_prompt(q, d, instruction), return_tensors="pt", add_special_tokens=False)
            logits = model(**ids).logits[0, -1]
            out.append(torch.softmax(logits[[no, yes]], -1)[1].item())
    return out
