"""A custom architecture in one file (the example of docs/custom_model.md).

Importing this module registers "MyForCausalLM": pre-norm blocks with
grouped-query attention, rotary positions and a GELU MLP with biases, tied
embeddings. ``save_random_checkpoint`` writes config.json + model.safetensors
(+ a word-level tokenizer) so that ``LLM(folder)`` serves it.
"""

from __future__ import annotations

import json
import os

import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

import pagedjax.models as models
from pagedjax.models import layers as L
from pagedjax.models import nn
from pagedjax.models.common import DecoderLM, hf, hf_linear, make_info, qkv_spec


class MyBlock(nnx.Module):
    def __init__(self, h, heads, kv_heads, inter, *, dtype):
        d = h // heads
        self.norm1 = nn.RMSNorm(h, 1e-5, dtype=dtype)
        self.attn = nn.Attention(h, heads, kv_heads, d, sm_scale=d**-0.5, dtype=dtype)
        self.norm2 = nn.RMSNorm(h, 1e-5, dtype=dtype)
        self.mlp = nn.PlainMLP(h, inter, "gelu", dtype=dtype)

    def __call__(self, x, cache, meta, plan, rope):  # x [T, H]; rope: cos, sin [T, D/2]
        a, cache = self.attn(self.norm1(x), cache, meta, plan, rope)
        x = x + a
        return x + self.mlp(self.norm2(x), plan), cache


@models.register_model("MyForCausalLM")
class MyForCausalLM(DecoderLM):
    def __init__(self, config: dict, *, dtype, rngs):
        h, heads, kv = config["hidden_size"], config["num_heads"], config["num_kv_heads"]
        self.num_layers, self.kv_heads, self.head_dim = config["num_layers"], kv, h // heads
        self.info = make_info(config, "MyForCausalLM", dtype, num_layers=self.num_layers,
                              num_q_heads=heads, num_kv_heads=kv, head_dim=h // heads,
                              hidden_size=h, vocab_size=config["vocab_size"],
                              max_model_len=config["max_len"])
        self.inv_freq = tuple(float(f) for f in L.rope_inv_freq(h // heads, 10000.0))
        self.embed_tokens = nn.Embed(config["vocab_size"], h, dtype=dtype)
        self.layers = nnx.List([MyBlock(h, heads, kv, config["ffn"], dtype=dtype)
                                for _ in range(self.num_layers)])
        self.norm = nn.RMSNorm(h, 1e-5, dtype=dtype)

    def embed(self, token_ids, meta, plan):  # i32[T] -> x [T, H], rotary cos/sin [T, D/2]
        x = self.embed_tokens(token_ids)
        return x, L.rope_cos_sin(meta.positions, jnp.asarray(self.inv_freq), x.dtype)

    def final(self, x, plan):  # [T, H]
        return self.norm(x)

    def weight_map(self) -> dict:
        out = {"embed_tokens.embedding": hf("embed.weight"), "norm.scale": hf("norm.weight")}
        for i in range(self.num_layers):
            me, ck = f"layers.{i}.", f"blocks.{i}."
            out.update({
                me + "norm1.scale": hf(ck + "norm1.weight"),
                me + "norm2.scale": hf(ck + "norm2.weight"),
                me + "attn.qkv_proj.kernel": qkv_spec(ck + "attn.", self.kv_heads, self.head_dim),
                me + "attn.o_proj.kernel": hf_linear(ck + "attn.o_proj.weight"),
                me + "mlp.fc1.kernel": hf_linear(ck + "fc1.weight"),
                me + "mlp.fc1.bias": hf(ck + "fc1.bias"),
                me + "mlp.fc2.kernel": hf_linear(ck + "fc2.weight"),
                me + "mlp.fc2.bias": hf(ck + "fc2.bias"),
            })
        return out


CONFIG = {"architectures": ["MyForCausalLM"], "hidden_size": 64, "num_heads": 4,
          "num_kv_heads": 2, "num_layers": 2, "ffn": 128, "vocab_size": 96, "max_len": 128,
          "eos_token_id": 2, "bos_token_id": 1}


def random_weights(config: dict = CONFIG, seed: int = 0) -> dict[str, np.ndarray]:
    """PyTorch-style tensors ([out, in] Linear weights) named as the checkpoint names them."""
    rng = np.random.default_rng(seed)
    h, v, f = config["hidden_size"], config["vocab_size"], config["ffn"]
    kv = config["num_kv_heads"] * h // config["num_heads"]

    def w(*shape, s=0.15):
        return (s * rng.standard_normal(shape)).astype(np.float32)

    out = {"embed.weight": w(v, h, s=1.0), "norm.weight": 1 + w(h, s=0.1)}
    for i in range(config["num_layers"]):
        b = f"blocks.{i}."
        out.update({b + "norm1.weight": 1 + w(h, s=0.1), b + "norm2.weight": 1 + w(h, s=0.1),
                    b + "attn.q_proj.weight": w(h, h), b + "attn.k_proj.weight": w(kv, h),
                    b + "attn.v_proj.weight": w(kv, h), b + "attn.o_proj.weight": w(h, h),
                    b + "fc1.weight": w(f, h), b + "fc1.bias": w(f), b + "fc2.weight": w(h, f),
                    b + "fc2.bias": w(h)})
    return out


def save_random_checkpoint(folder: str, config: dict = CONFIG, seed: int = 0) -> dict:
    """config.json + model.safetensors (+ tokenizer files) in ``folder``; returns the tensors."""
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    tensors = random_weights(config, seed)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return tensors


def reference_logits(tensors: dict, ids: list[int], config: dict = CONFIG) -> np.ndarray:
    """The same model in plain numpy (float64, full causal attention): f[len(ids), V]."""
    t = {k: v.astype(np.float64) for k, v in tensors.items()}
    h, nh, nkv = config["hidden_size"], config["num_heads"], config["num_kv_heads"]
    d, n = h // nh, len(ids)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w

    inv = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
    ang = np.arange(n)[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def rot(x):  # [n, heads, d]
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    x = t["embed.weight"][ids]
    mask = np.tril(np.ones((n, n), bool))
    for i in range(config["num_layers"]):
        b = f"blocks.{i}."
        y = rms(x, t[b + "norm1.weight"])
        q = rot((y @ t[b + "attn.q_proj.weight"].T).reshape(n, nh, d))
        k = rot((y @ t[b + "attn.k_proj.weight"].T).reshape(n, nkv, d))
        v = (y @ t[b + "attn.v_proj.weight"].T).reshape(n, nkv, d)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", p, v).reshape(n, h)
        x = x + o @ t[b + "attn.o_proj.weight"].T
        y = rms(x, t[b + "norm2.weight"])
        u = y @ t[b + "fc1.weight"].T + t[b + "fc1.bias"]
        u = 0.5 * u * (1 + np.vectorize(math.erf)(u / np.sqrt(2)))
        x = x + u @ t[b + "fc2.weight"].T + t[b + "fc2.bias"]
    return rms(x, t["norm.weight"]) @ t["embed.weight"].T
