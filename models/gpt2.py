"""GPT2LMHeadModel: learned positions, pre-LayerNorm blocks, tied LM head.

HF GPT-2 stores its projections as ``Conv1D`` ([in, out], already our
``kernel`` layout). State:

    embed_tokens.embedding        [V, H]      (wte)
    embed_positions.embedding     [P, H]      (wpe)
    layers[i].ln_1.{scale,bias}   [H]
    layers[i].attn.qkv_proj.{kernel [H, Hq, 3, D], bias [Hq, 3, D]}
    layers[i].attn.o_proj.{kernel [H, H], bias [H]}
    layers[i].ln_2.{scale,bias}   [H]
    layers[i].mlp.fc1.{kernel [H, I], bias [I]}, mlp.fc2.{kernel [I, H], bias [H]}
    ln_f.{scale,bias}             [H]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pagedjax.models import layers as L
from pagedjax.models import nn
from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from pagedjax.models.common import ConfigReader, DecoderLM, WeightSpec, hf, make_info


class GPT2Block(nnx.Module):
    def __init__(self, h: int, nh: int, inter: int, eps: float, act: str, sm_scale: float, dtype):
        self.ln_1 = nn.LayerNorm(h, eps, dtype=dtype)
        self.attn = nn.Attention(h, nh, nh, h // nh, sm_scale=sm_scale, qkv_bias=True,
                                 o_bias=True, dtype=dtype)
        self.ln_2 = nn.LayerNorm(h, eps, dtype=dtype)
        self.mlp = nn.PlainMLP(h, inter, act, dtype=dtype)

    def __call__(self, x, cache, meta, plan, ctx):  # x [T, H]
        a, cache = self.attn(self.ln_1(x), cache, meta, plan)
        x = x + a
        return x + self.mlp(self.ln_2(x), plan), cache


class GPT2LMHeadModel(DecoderLM):
    architecture = "GPT2LMHeadModel"

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        c = ConfigReader(dict(config), self.architecture)
        self.hidden_size = h = int(c.get("n_embd", c.get("hidden_size", 768)))
        self.num_layers = int(c.get("n_layer", c.get("num_hidden_layers", 12)))
        self.num_heads = nh = int(c.get("n_head", c.get("num_attention_heads", 12)))
        self.head_dim = h // nh
        eps = float(c.get("layer_norm_epsilon", 1e-5))
        act = c.get("activation_function", "gelu_new")
        L.activation(act)
        if c.get("scale_attn_by_inverse_layer_idx", False):
            raise c.unsupported("scale_attn_by_inverse_layer_idx", True, "only false")
        if c.get("add_cross_attention", False):
            raise c.unsupported("add_cross_attention", True, "only false")
        sm_scale = self.head_dim**-0.5 if c.get("scale_attn_weights", True) else 1.0
        vocab = int(c.require("vocab_size"))
        max_len = int(c.get("n_positions", c.get("max_position_embeddings", 1024)))
        inter = int(c.get("n_inner", 4 * h))
        self.info = make_info(c.config, self.architecture, dtype, num_layers=self.num_layers,
                              num_q_heads=nh, num_kv_heads=nh, head_dim=self.head_dim,
                              hidden_size=h, vocab_size=vocab, max_model_len=max_len)
        self.embed_tokens = nn.Embed(vocab, h, dtype=dtype)
        self.embed_positions = nn.Embed(max_len, h, dtype=dtype, axes=("pos", "embed"))
        self.layers = nnx.List([GPT2Block(h, nh, inter, eps, act, sm_scale, dtype)
                                for _ in range(self.num_layers)])
        self.ln_f = nn.LayerNorm(h, eps, dtype=dtype)

    def embed(self, token_ids: jax.Array, meta: AttentionMetadata,
              plan: ExecutionPlan = DEFAULT_PLAN):  # i32[T] -> x [T, H], None
        x = self.embed_tokens(token_ids)
        return x + self.embed_positions(meta.positions, x.dtype), None

    def final(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:
        return self.ln_f(x)

    def weight_map(self) -> dict:
        h, nh, d = self.hidden_size, self.num_heads, self.head_dim

        def ln(me, name):
            return {me + ".scale": hf(name + ".weight"), me + ".bias": hf(name + ".bias")}

        def qkv_kernel(w):  # Conv1D [H, 3*H] -> [H, Hq, 3, D]
            return np.ascontiguousarray(w.reshape(h, 3, nh, d).transpose(0, 2, 1, 3))

        def qkv_bias(b):  # [3*H] -> [Hq, 3, D]
            return np.ascontiguousarray(b.reshape(3, nh, d).transpose(1, 0, 2))

        out = {"embed_tokens.embedding": hf("transformer.wte.weight"),
               "embed_positions.embedding": hf("transformer.wpe.weight"),
               **ln("ln_f", "transformer.ln_f")}
        for i in range(self.num_layers):
            pre, me = f"transformer.h.{i}.", f"layers.{i}."
            out.update({
                **ln(me + "ln_1", pre + "ln_1"), **ln(me + "ln_2", pre + "ln_2"),
                me + "attn.qkv_proj.kernel": WeightSpec((pre + "attn.c_attn.weight",), qkv_kernel),
                me + "attn.qkv_proj.bias": WeightSpec((pre + "attn.c_attn.bias",), qkv_bias),
                me + "attn.o_proj.kernel": hf(pre + "attn.c_proj.weight"),
                me + "attn.o_proj.bias": hf(pre + "attn.c_proj.bias"),
                me + "mlp.fc1.kernel": hf(pre + "mlp.c_fc.weight"),
                me + "mlp.fc1.bias": hf(pre + "mlp.c_fc.bias"),
                me + "mlp.fc2.kernel": hf(pre + "mlp.c_proj.weight"),
                me + "mlp.fc2.bias": hf(pre + "mlp.c_proj.bias"),
            })
        return out
