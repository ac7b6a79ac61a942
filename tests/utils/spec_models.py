"""Tiny random Llama models for the speculative decoding tests (HF folders with a
word-level tokenizer): a target and a draft of the same vocabulary."""

from __future__ import annotations


def make_tiny_llama(folder: str, vocab: int, layers: int, seed: int, scale: float = 0.15,
                    hidden: int = 64) -> str:
    import torch
    import transformers

    from tests.distributed.test_parallel import save_tiny_tokenizer

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=96,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    hf.save_pretrained(folder)
    save_tiny_tokenizer(folder, vocab)
    return folder
