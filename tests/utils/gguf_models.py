"""Tiny Llama GGUF files with chosen block formats per tensor, written with the
``gguf`` package's writer (tests/models/test_quantization.py, test_block_kernel.py)."""

from __future__ import annotations

import numpy as np

# llama.cpp's names of one layer's projections
LAYER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def raw_blocks(kind: str, rows: int, n: int, rng, amplitude: float = 1.0,
               d_max: float = 0.05) -> np.ndarray:
    """Valid GGUF blocks u8[rows, bytes] of ``kind`` for rows of ``n`` values: Q8_0 / Q4_0 /
    Q4_1 quantized from normal values of ``amplitude`` by gguf; Q4_K / Q6_K random bytes
    with finite float16 super-block scales in [0.001, d_max]."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind.upper()]
    if kind in ("q8_0", "q4_0", "q4_1"):
        return gguf.quants.quantize(rng.standard_normal((rows, n)).astype(np.float32) * amplitude,
                                    qtype)
    size, f16_at = {"q4_k": (144, (0, 2)), "q6_k": (210, (208,))}[kind]
    raw = rng.integers(0, 256, (rows, n // 256, size), dtype=np.uint8)
    for off in f16_at:
        d = rng.uniform(0.001, d_max, (rows, n // 256)).astype(np.float16)
        raw[..., off:off + 2] = d[..., None].view(np.uint8).reshape(rows, n // 256, 2)
    return raw.reshape(rows, -1)


def write_llama_gguf(path: str, kinds: dict[str, str], embed_kind: str, rng, *, h: int = 256,
                     ffn: int = 512, heads: int = 4, kv: int = 2, vocab: int = 96,
                     n_layers: int = 2, amplitude: float = 1.0, d_max: float = 0.05) -> str:
    """A tiny Llama GGUF at ``path``: each layer tensor of LAYER in ``kinds[name]``, the
    tied embedding in ``embed_kind``, float32 norms; returns ``path``."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    for add, v in ((w.add_block_count, n_layers), (w.add_context_length, 64),
                   (w.add_embedding_length, h), (w.add_feed_forward_length, ffn),
                   (w.add_head_count, heads), (w.add_head_count_kv, kv),
                   (w.add_vocab_size, vocab)):
        add(v)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    d = h // heads

    def add(name, rows, n, kind):
        w.add_tensor(name, raw_blocks(kind, rows, n, rng, amplitude, d_max),
                     raw_dtype=gguf.GGMLQuantizationType[kind.upper()])

    add("token_embd.weight", vocab, h, embed_kind)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
    shapes = {"attn_q": (heads * d, h), "attn_k": (kv * d, h), "attn_v": (kv * d, h),
              "attn_output": (h, heads * d), "ffn_gate": (ffn, h), "ffn_up": (ffn, h),
              "ffn_down": (h, ffn)}
    for i in range(n_layers):
        b = f"blk.{i}."
        for n in ("attn_norm", "ffn_norm"):
            w.add_tensor(b + n + ".weight", (1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
        for name in LAYER:
            add(b + name + ".weight", *shapes[name], kinds[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
