"""Llama family: LlamaForCausalLM (SmolLM2, TinyLlama, Vicuna) and MistralForCausalLM.

Parameter tree (see ``layers.py`` for the fused layouts):

    embed_tokens.embedding                 [V, H]
    layers[i].input_layernorm.scale        [H]
    layers[i].attn.qkv_proj.kernel         [H, Hkv, G+2, D]   (.bias with attention_bias)
    layers[i].attn.o_proj.kernel           [Hq*D, H]
    layers[i].post_attention_layernorm.scale [H]
    layers[i].mlp.gate_up.kernel           [H, 2, I]
    layers[i].mlp.down.kernel              [I, H]
    norm.scale                             [H]
    lm_head.kernel                         [H, V]   (absent when embeddings are tied)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models import layers as L
from models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from models.common import CausalLM, GetTensor


class LlamaForCausalLM(CausalLM):
    architecture = "LlamaForCausalLM"
    default_qkv_bias = False
    default_tie_word_embeddings = False

    def __init__(self, config: dict, dtype=jnp.float32, eos_token_ids=None):
        super().__init__(config, dtype, eos_token_ids)
        c = self.cfg
        self.hidden_size = int(c.require("hidden_size"))
        self.num_layers = int(c.require("num_hidden_layers"))
        self.num_heads = int(c.require("num_attention_heads"))
        self.num_kv_heads = int(c.get("num_key_value_heads", self.num_heads))
        if self.num_heads % self.num_kv_heads:
            raise c.unsupported("num_key_value_heads", self.num_kv_heads,
                                f"must divide num_attention_heads={self.num_heads}")
        self.head_dim = int(c.get("head_dim", self.hidden_size // self.num_heads))
        self.intermediate_size = int(c.require("intermediate_size"))
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.act = L.activation(c.get("hidden_act", "silu"))
        self.qkv_bias = bool(c.get("attention_bias", self.default_qkv_bias))
        self.o_bias = bool(c.get("attention_bias", False))
        if c.get("mlp_bias", False):
            raise c.unsupported("mlp_bias", True, "only mlp_bias=false")
        theta, scaling = c.rope()
        self.inv_freq = L.rope_inv_freq(self.head_dim, theta, scaling)
        self.sliding_windows = self._sliding_windows()
        self.sm_scale = self.head_dim**-0.5
        self.info = self._make_info(
            num_layers=self.num_layers, num_q_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            hidden_size=self.hidden_size, vocab_size=c.require("vocab_size"),
            max_model_len=c.get("max_position_embeddings", 2048),
        )

    def _sliding_windows(self) -> tuple[int | None, ...]:
        """Per-layer sliding window from ``layer_types`` (None = full attention)."""
        window = self.cfg.get("sliding_window")
        types = self.config.get("layer_types")
        if not types or window is None:
            return (None,) * self.num_layers
        return tuple(int(window) if t == "sliding_attention" else None for t in types)

    # -- forward ------------------------------------------------------------------

    def forward(
        self,
        params: dict,
        kv_caches: tuple,  # per layer (pages [N, 2, Hkv, page_size, D], scales | None)
        token_ids: jax.Array,  # i32[T]
        meta: AttentionMetadata,
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> tuple[jax.Array, tuple]:  # hidden [T, H] (after the final norm), kv_caches
        if isinstance(params["layers"], dict):  # stacked: see stack_params
            return self._forward_scanned(params, kv_caches, token_ids, meta, plan)
        self._check_kv_caches(kv_caches)
        x = jnp.take(params["embed_tokens"]["embedding"], token_ids, axis=0)  # [T, H]
        rope = L.rope_cos_sin(meta.positions, self.inv_freq, x.dtype)
        new_caches = []
        for i, lp in enumerate(params["layers"]):
            h = L.rms_norm(x, lp["input_layernorm"]["scale"], self.eps)
            a, cache = L.paged_attention(
                lp["attn"], h, kv_caches[i], meta, plan, sm_scale=self.sm_scale, rope=rope,
                sliding_window=self.sliding_windows[i],
            )
            new_caches.append(cache)
            x = x + a
            h = L.rms_norm(x, lp["post_attention_layernorm"]["scale"], self.eps)
            x = x + L.gated_mlp(lp["mlp"], h, self.act, plan)
        return L.rms_norm(x, params["norm"]["scale"], self.eps), tuple(new_caches)

    # -- scanned layers -------------------------------------------------------------
    # One compiled layer body run num_layers times (lax.scan) instead of
    # num_layers unrolled copies: compile time drops several-fold on CPU.
    # Parameters are stacked along a leading layer axis and the KV pool of all
    # layers is one array [L, N, 2, Hkv, page_size, D]; layer l addresses it as
    # a flat pool of L*N pages with its page ids offset by l*N.

    def can_scan(self) -> bool:
        return len(set(self.sliding_windows)) == 1

    @staticmethod
    def stack_params(params: dict) -> dict:
        out = dict(params)
        out["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params["layers"])
        return out

    @staticmethod
    def stack_kv_caches(kv_caches: tuple) -> tuple:
        pages = jnp.stack([p for p, _ in kv_caches])
        scales = None if kv_caches[0][1] is None else jnp.stack([s for _, s in kv_caches])
        return (pages, scales)

    def _forward_scanned(self, params, kv_caches, token_ids, meta, plan):
        pages, scales = kv_caches  # [L, N, 2, Hkv, page_size, D], [L, N, 2, Hkv, page_size]
        n_layers, n_pages = pages.shape[:2]
        page_size = pages.shape[4]
        flat = pages.reshape((n_layers * n_pages,) + pages.shape[2:])
        flat_s = None if scales is None else scales.reshape((n_layers * n_pages,) + scales.shape[2:])
        x = jnp.take(params["embed_tokens"]["embedding"], token_ids, axis=0)  # [T, H]
        rope = L.rope_cos_sin(meta.positions, self.inv_freq, x.dtype)
        window = self.sliding_windows[0]

        def layer(carry, lp):
            x, flat, flat_s, layer_idx = carry
            off = layer_idx * n_pages
            lmeta = dataclasses.replace(meta, page_table=meta.page_table + off,
                                        slot_mapping=meta.slot_mapping + off * page_size)
            h = L.rms_norm(x, lp["input_layernorm"]["scale"], self.eps)
            a, (flat, flat_s) = L.paged_attention(
                lp["attn"], h, (flat, flat_s), lmeta, plan, sm_scale=self.sm_scale, rope=rope,
                sliding_window=window)
            x = x + a
            h = L.rms_norm(x, lp["post_attention_layernorm"]["scale"], self.eps)
            x = x + L.gated_mlp(lp["mlp"], h, self.act, plan)
            return (x, flat, flat_s, layer_idx + 1), None

        (x, flat, flat_s, _), _ = jax.lax.scan(
            layer, (x, flat, flat_s, jnp.int32(0)), params["layers"])
        new = (flat.reshape(pages.shape), None if flat_s is None else flat_s.reshape(scales.shape))
        return L.rms_norm(x, params["norm"]["scale"], self.eps), new

    # -- weights ------------------------------------------------------------------

    def params_from_hf(self, get: GetTensor) -> dict:
        hkv, d = self.num_kv_heads, self.head_dim
        layers = []
        for i in range(self.num_layers):
            pre = f"model.layers.{i}."
            att = pre + "self_attn."
            attn = {
                "qkv_proj": {
                    "kernel": L.pack_qkv(get(att + "q_proj.weight"), get(att + "k_proj.weight"),
                                         get(att + "v_proj.weight"), hkv, d)
                },
                "o_proj": {"kernel": get(att + "o_proj.weight").T},
            }
            if self.qkv_bias:
                attn["qkv_proj"]["bias"] = L.pack_qkv_bias(
                    get(att + "q_proj.bias"), get(att + "k_proj.bias"), get(att + "v_proj.bias"),
                    hkv, d)
            if self.o_bias:
                attn["o_proj"]["bias"] = get(att + "o_proj.bias")
            layers.append({
                "input_layernorm": {"scale": get(pre + "input_layernorm.weight")},
                "attn": attn,
                "post_attention_layernorm": {"scale": get(pre + "post_attention_layernorm.weight")},
                "mlp": {
                    "gate_up": {"kernel": L.pack_gate_up(get(pre + "mlp.gate_proj.weight"),
                                                         get(pre + "mlp.up_proj.weight"))},
                    "down": {"kernel": get(pre + "mlp.down_proj.weight").T},
                },
            })
        params = {
            "embed_tokens": {"embedding": get("model.embed_tokens.weight")},
            "layers": layers,
            "norm": {"scale": get("model.norm.weight")},
        }
        return self._lm_head_from_hf(get, params)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama plus an optional sliding window on every layer."""

    architecture = "MistralForCausalLM"

    def _sliding_windows(self):
        window = self.cfg.get("sliding_window")
        if self.config.get("layer_types"):
            return super()._sliding_windows()
        return (None if window is None else int(window),) * self.num_layers
