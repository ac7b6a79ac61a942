"""Gemma3ForCausalLM (text): local sliding-window and global layers, q/k RMS norms,
two rotary bases, sqrt(H)-scaled embeddings, (1 + w) RMS norms, sandwich norms
around attention and MLP, gelu-tanh gated MLP, optional attention and final
logit soft caps, ``query_pre_attn_scalar`` attention scale.

State (norm ``scale`` holds HF's raw ``w``; the model applies 1 + w):

    embed_tokens.embedding                        [V, H]
    layers[i].input_layernorm.scale               [H]
    layers[i].attn.qkv_proj.kernel                [H, Hkv, G+2, D]
    layers[i].attn.q_norm.scale, attn.k_norm.scale [D]
    layers[i].attn.o_proj.kernel                  [Hq*D, H]
    layers[i].post_attention_layernorm.scale      [H]
    layers[i].pre_feedforward_layernorm.scale     [H]
    layers[i].mlp.gate_up.kernel [H, 2, I], mlp.down.kernel [I, H]
    layers[i].post_feedforward_layernorm.scale    [H]
    norm.scale                                    [H]
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

SLIDING, FULL = "sliding_attention", "full_attention"


class Gemma3Layer(nnx.Module):
    def __init__(self, m: "Gemma3ForCausalLM", layer_type: str, window: int, dtype):
        h, eps = m.hidden_size, m.eps

        def norm(n=h):
            return nn.RMSNorm(n, eps, unit_offset=True, dtype=dtype)

        self.layer_type = layer_type
        self.input_layernorm = norm()
        self.attn = nn.Attention(h, m.num_heads, m.num_kv_heads, m.head_dim,
                                 sm_scale=m.sm_scale, qk_norm_eps=eps, qk_norm_unit_offset=True,
                                 sliding_window=window if layer_type == SLIDING else None,
                                 soft_cap=m.attn_softcap, dtype=dtype)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = nn.GatedMLP(h, m.intermediate_size, m.act_name, dtype=dtype)
        self.post_feedforward_layernorm = norm()

    def __call__(self, x, cache, meta, plan, ropes):  # x [T, H]; ropes: type -> (cos, sin)
        a, cache = self.attn(self.input_layernorm(x), cache, meta, plan, ropes[self.layer_type])
        x = x + self.post_attention_layernorm(a)
        h = self.mlp(self.pre_feedforward_layernorm(x), plan)
        return x + self.post_feedforward_layernorm(h), cache


class Gemma3ForCausalLM(DecoderLM):
    architecture = "Gemma3ForCausalLM"

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        c = ConfigReader(dict(config), self.architecture)
        self.hidden_size = int(c.require("hidden_size"))
        self.num_layers = int(c.require("num_hidden_layers"))
        self.num_heads = int(c.require("num_attention_heads"))
        self.num_kv_heads = int(c.get("num_key_value_heads", self.num_heads))
        self.head_dim = int(c.get("head_dim", 256))
        self.intermediate_size = int(c.require("intermediate_size"))
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.act_name = c.get("hidden_activation", c.get("hidden_act", "gelu_pytorch_tanh"))
        L.activation(self.act_name)
        if c.get("attention_bias", False):
            raise c.unsupported("attention_bias", True, "only false")
        self.sm_scale = float(c.get("query_pre_attn_scalar", self.head_dim)) ** -0.5
        self.attn_softcap = c.get("attn_logit_softcapping")
        self.final_logit_softcap = c.get("final_logit_softcapping")
        self.tie = bool(c.get("tie_word_embeddings", True))
        types = self._layer_types(c)
        window = int(c.require("sliding_window"))
        g_theta, g_scaling = c.rope(FULL, default_theta=1_000_000.0)
        l_theta, l_scaling = c.rope(SLIDING, legacy_theta_key="rope_local_base_freq")
        self.inv_freq = (
            (FULL, tuple(map(float, L.rope_inv_freq(self.head_dim, g_theta, g_scaling)))),
            (SLIDING, tuple(map(float, L.rope_inv_freq(self.head_dim, l_theta, l_scaling)))))
        vocab = int(c.require("vocab_size"))
        self.info = make_info(c.config, self.architecture, dtype, num_layers=self.num_layers,
                              num_q_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                              head_dim=self.head_dim, hidden_size=self.hidden_size,
                              vocab_size=vocab,
                              max_model_len=c.get("max_position_embeddings", 32768),
                              layer_windows=[window if t == SLIDING else None for t in types])
        self.embed_tokens = nn.Embed(vocab, self.hidden_size, dtype=dtype)
        self.layers = nnx.List([Gemma3Layer(self, t, window, dtype) for t in types])
        self.norm = nn.RMSNorm(self.hidden_size, self.eps, unit_offset=True, dtype=dtype)
        self.lm_head = None if self.tie else nn.Linear(
            self.hidden_size, vocab, ("embed", "vocab"), dtype=dtype)

    def _layer_types(self, c: ConfigReader) -> tuple[str, ...]:
        types = c.config.get("layer_types")
        if not types:
            pattern = int(c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6)))
            types = [SLIDING if (i + 1) % pattern else FULL for i in range(self.num_layers)]
        bad = sorted(set(types) - {SLIDING, FULL})
        if bad or len(types) != self.num_layers:
            raise c.unsupported("layer_types", types,
                                f"need {self.num_layers} of {SLIDING!r}/{FULL!r}")
        return tuple(types)

    def embed(self, token_ids: jax.Array, meta: AttentionMetadata,
              plan: ExecutionPlan = DEFAULT_PLAN):  # i32[T] -> x [T, H], {type: (cos, sin)}
        x = self.embed_tokens(token_ids)
        x = x * jnp.asarray(self.hidden_size**0.5, x.dtype)
        ropes = {t: L.rope_cos_sin(meta.positions, jnp.asarray(f, jnp.float32), x.dtype)
                 for t, f in self.inv_freq}
        return x, ropes

    def final(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:
        return self.norm(x)

    def weight_map(self) -> dict:
        hkv, d = self.num_kv_heads, self.head_dim
        out = {"embed_tokens.embedding": hf("model.embed_tokens.weight"),
               "norm.scale": hf("model.norm.weight")}
        if not self.tie:
            out["lm_head.kernel"] = hf_linear("lm_head.weight")
        for i in range(self.num_layers):
            pre, me = f"model.layers.{i}.", f"layers.{i}."
            at = pre + "self_attn."
            for n in ("input_layernorm", "post_attention_layernorm",
                      "pre_feedforward_layernorm", "post_feedforward_layernorm"):
                out[f"{me}{n}.scale"] = hf(f"{pre}{n}.weight")
            out.update({
                me + "attn.qkv_proj.kernel": qkv_spec(at, hkv, d),
                me + "attn.q_norm.scale": hf(at + "q_norm.weight"),
                me + "attn.k_norm.scale": hf(at + "k_norm.weight"),
                me + "attn.o_proj.kernel": hf_linear(at + "o_proj.weight"),
                me + "mlp.gate_up.kernel": hf_fused(pack_gate_up, pre + "mlp.gate_proj.weight",
                                                    pre + "mlp.up_proj.weight"),
                me + "mlp.down.kernel": hf_linear(pre + "mlp.down_proj.weight"),
            })
        return out
