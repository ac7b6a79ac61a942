"""Tiny random transformers models and PEFT adapters for the LoRA tests."""

from __future__ import annotations

import numpy as np

LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_hf_model(arch: str, vocab: int = 96, seed: int = 0):
    """A tiny random transformers model (eval mode), weights std ~0.15."""
    import torch
    import transformers as T

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2)
    cfg = {"llama": lambda: T.LlamaConfig(**common, tie_word_embeddings=False),
           "qwen2": lambda: T.Qwen2Config(**common, tie_word_embeddings=False),
           "phi3": lambda: T.Phi3Config(**common, tie_word_embeddings=False, pad_token_id=0),
           }[arch]()
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


def make_adapter(base, folder: str, *, seed: int, r: int = 4, alpha: float = 8.0,
                 targets=None, rslora: bool = False):
    """A PEFT LoRA adapter on ``base`` with random non-zero A and B, saved to ``folder``;
    returns the PEFT model (eval mode) for reference logits."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or LLAMA_TARGETS,
                     lora_dropout=0.0, init_lora_weights=False, use_rslora=rslora)
    peft_model = get_peft_model(copy.deepcopy(base), cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(folder)
    return peft_model.eval()


def torch_logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float().numpy()
