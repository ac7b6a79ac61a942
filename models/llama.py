"""Llama family: LlamaForCausalLM (SmolLM2, TinyLlama, Vicuna), MistralForCausalLM,
and the base of Qwen2 / Qwen3 / Phi-3.

State (see ``models/nn.py`` for the fused layouts and logical axes):

    embed_tokens.embedding                 [V, H]
    layers[i].input_layernorm.scale        [H]
    layers[i].attn.qkv_proj.kernel         [H, Hkv, G+2, D]   (.bias with attention_bias)
    layers[i].attn.q_norm/k_norm.scale     [D]                (Qwen3)
    layers[i].attn.o_proj.kernel           [Hq*D, H]
    layers[i].post_attention_layernorm.scale [H]
    layers[i].mlp.gate_up.kernel           [H, 2, I]
    layers[i].mlp.down.kernel              [I, H]
    norm.scale                             [H]
    lm_head.kernel                         [H, V]   (absent when embeddings are tied)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from pagedjax.models import layers as L
from pagedjax.models import nn
from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from pagedjax.models.common import (
    ConfigReader,
    DecoderLM,
    hf,
    hf_fused,
    hf_linear,
    make_info,
    pack_gate_up,
    qkv_spec,
)


class LlamaLayer(nnx.Module):
    def __init__(self, m: "LlamaForCausalLM", window: int | None, dtype, index: int = 0):
        self.input_layernorm = nn.RMSNorm(m.hidden_size, m.eps, dtype=dtype)
        self.attn = nn.Attention(m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
                                 sm_scale=m.head_dim**-0.5, qkv_bias=m.qkv_bias, o_bias=m.o_bias,
                                 qk_norm_eps=m.eps if m.qk_norm else None,
                                 sliding_window=window, dtype=dtype)
        self.post_attention_layernorm = nn.RMSNorm(m.hidden_size, m.eps, dtype=dtype)
        self.mlp = m.make_mlp(index, dtype)

    def __call__(self, x, cache, meta, plan, rope):  # x [T, H], rope: cos, sin [T, D/2]
        a, cache = self.attn(self.input_layernorm(x), cache, meta, plan, rope)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x), plan, meta.lora_slots), cache


class LlamaForCausalLM(DecoderLM):
    architecture = "LlamaForCausalLM"
    default_qkv_bias = False
    default_tie_word_embeddings = False
    qk_norm = False
    supports_lora = True  # q/k/v/o and gate/up/down (models/lora.py); subclasses inherit

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        c = ConfigReader(dict(config), self.architecture)  # not stored: graphs hold hashables
        self.hidden_size = int(c.require("hidden_size"))
        self.num_layers = int(c.require("num_hidden_layers"))
        self.num_heads = int(c.require("num_attention_heads"))
        self.num_kv_heads = int(c.get("num_key_value_heads", self.num_heads))
        if self.num_heads % self.num_kv_heads:
            raise c.unsupported("num_key_value_heads", self.num_kv_heads,
                                f"must divide num_attention_heads={self.num_heads}")
        self.head_dim = int(c.get("head_dim", self.hidden_size // self.num_heads))
        self.intermediate_size = int(c.require("intermediate_size"))
        self.vocab_size = int(c.require("vocab_size"))
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.act_name = c.get("hidden_act", "silu")
        L.activation(self.act_name)  # validate
        self.qkv_bias = bool(c.get("attention_bias", self.default_qkv_bias))
        self.o_bias = bool(c.get("attention_bias", False))
        if c.get("mlp_bias", False):
            raise c.unsupported("mlp_bias", True, "only mlp_bias=false")
        self.tie = bool(c.get("tie_word_embeddings", self.default_tie_word_embeddings))
        self.inv_freq, self.rope_scale = self._rope(c)
        windows = self._sliding_windows(c)
        self.info = make_info(
            c.config, self.architecture, dtype, num_layers=self.num_layers,
            num_q_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            hidden_size=self.hidden_size, vocab_size=self.vocab_size,
            max_model_len=c.get("max_position_embeddings", 2048))
        self.embed_tokens = nn.Embed(self.vocab_size, self.hidden_size, dtype=dtype)
        self.layers = nnx.List([LlamaLayer(self, w, dtype, i) for i, w in enumerate(windows)])
        self.norm = nn.RMSNorm(self.hidden_size, self.eps, dtype=dtype)
        self.lm_head = None if self.tie else nn.Linear(
            self.hidden_size, self.vocab_size, ("embed", "vocab"), dtype=dtype)

    def _rope(self, c: ConfigReader) -> tuple[tuple[float, ...], float]:
        """(inverse frequencies, cos/sin scale) of the rotary embedding."""
        theta, scaling = c.rope()
        return tuple(float(f) for f in L.rope_inv_freq(self.head_dim, theta, scaling)), 1.0

    def _sliding_windows(self, c: ConfigReader) -> tuple[int | None, ...]:
        """Per-layer sliding window from ``layer_types`` (None = full attention)."""
        window = c.get("sliding_window")
        types = c.config.get("layer_types")
        if not types or window is None:
            return (None,) * self.num_layers
        return tuple(int(window) if t == "sliding_attention" else None for t in types)

    def make_mlp(self, index: int, dtype) -> nnx.Module:
        """Layer ``index``'s MLP, called as ``mlp(x, plan, lora_slots)`` (the MoE
        architectures return their sparse block here)."""
        return nn.GatedMLP(self.hidden_size, self.intermediate_size, self.act_name, dtype=dtype)

    # -- forward pieces (models/common.py) ------------------------------------------------

    def embed(self, token_ids: jax.Array, meta: AttentionMetadata,
              plan: ExecutionPlan = DEFAULT_PLAN):  # i32[T] -> x [T, H], (cos, sin [T, D/2])
        x = self.embed_tokens(token_ids)
        cos, sin = L.rope_cos_sin(meta.positions, jnp.asarray(self.inv_freq, jnp.float32),
                                  x.dtype)
        if self.rope_scale != 1.0:
            cos, sin = cos * self.rope_scale, sin * self.rope_scale
        return x, (cos, sin)

    def final(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:  # [T, H]
        return self.norm(x)

    # -- weights --------------------------------------------------------------------------

    def layer_weight_map(self, i: int) -> dict:
        pre, at = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        me = f"layers.{i}."
        hkv, d = self.num_kv_heads, self.head_dim
        out = {
            me + "input_layernorm.scale": hf(pre + "input_layernorm.weight"),
            me + "attn.qkv_proj.kernel": qkv_spec(at, hkv, d),
            me + "attn.o_proj.kernel": hf_linear(at + "o_proj.weight"),
            me + "post_attention_layernorm.scale": hf(pre + "post_attention_layernorm.weight"),
            **self.mlp_weight_map(i),
        }
        if self.qkv_bias:
            out[me + "attn.qkv_proj.bias"] = qkv_spec(at, hkv, d, "bias")
        if self.o_bias:
            out[me + "attn.o_proj.bias"] = hf(at + "o_proj.bias")
        if self.qk_norm:
            out[me + "attn.q_norm.scale"] = hf(at + "q_norm.weight")
            out[me + "attn.k_norm.scale"] = hf(at + "k_norm.weight")
        return out

    def mlp_weight_map(self, i: int) -> dict:
        pre, me = f"model.layers.{i}.mlp.", f"layers.{i}.mlp."
        return {me + "gate_up.kernel": hf_fused(pack_gate_up, pre + "gate_proj.weight",
                                                pre + "up_proj.weight"),
                me + "down.kernel": hf_linear(pre + "down_proj.weight")}

    def weight_map(self) -> dict:
        out = {"embed_tokens.embedding": hf("model.embed_tokens.weight"),
               "norm.scale": hf("model.norm.weight")}
        for i in range(self.num_layers):
            out.update(self.layer_weight_map(i))
        if not self.tie:
            out["lm_head.kernel"] = hf_linear("lm_head.weight")
        return out


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama plus an optional sliding window on every layer."""

    architecture = "MistralForCausalLM"

    def _sliding_windows(self, c: ConfigReader):
        window = c.get("sliding_window")
        if c.config.get("layer_types"):
            return super()._sliding_windows(c)
        return (None if window is None else int(window),) * self.num_layers
