"""Gemma3ForCausalLM (text): local sliding-window and global layers, q/k RMS norms,
two rotary bases, sqrt(H)-scaled embeddings, (1 + w) RMS norms, sandwich norms
around attention and MLP, gelu-tanh gated MLP, optional attention and final
logit soft caps, ``query_pre_attn_scalar`` attention scale.

Parameter tree (norm ``scale`` holds HF's raw ``w``; the model applies 1 + w):

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

from models import layers as L
from models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from models.common import CausalLM, GetTensor

SLIDING, FULL = "sliding_attention", "full_attention"


class Gemma3ForCausalLM(CausalLM):
    architecture = "Gemma3ForCausalLM"

    def __init__(self, config: dict, dtype=jnp.float32, eos_token_ids=None):
        super().__init__(config, dtype, eos_token_ids)
        c = self.cfg
        self.hidden_size = int(c.require("hidden_size"))
        self.num_layers = int(c.require("num_hidden_layers"))
        self.num_heads = int(c.require("num_attention_heads"))
        self.num_kv_heads = int(c.get("num_key_value_heads", self.num_heads))
        self.head_dim = int(c.get("head_dim", 256))
        self.intermediate_size = int(c.require("intermediate_size"))
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.act = L.activation(c.get("hidden_activation", c.get("hidden_act", "gelu_pytorch_tanh")))
        if c.get("attention_bias", False):
            raise c.unsupported("attention_bias", True, "only false")
        self.sm_scale = float(c.get("query_pre_attn_scalar", self.head_dim)) ** -0.5
        self.attn_softcap = c.get("attn_logit_softcapping")
        self.final_logit_softcap = c.get("final_logit_softcapping")
        self.layer_types = self._layer_types()
        window = int(c.require("sliding_window"))
        self.windows = tuple(window if t == SLIDING else None for t in self.layer_types)
        g_theta, g_scaling = c.rope(FULL, default_theta=1_000_000.0)
        l_theta, l_scaling = c.rope(SLIDING, legacy_theta_key="rope_local_base_freq")
        self.inv_freq = {FULL: L.rope_inv_freq(self.head_dim, g_theta, g_scaling),
                         SLIDING: L.rope_inv_freq(self.head_dim, l_theta, l_scaling)}
        self.info = self._make_info(
            num_layers=self.num_layers, num_q_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            hidden_size=self.hidden_size, vocab_size=c.require("vocab_size"),
            max_model_len=c.get("max_position_embeddings", 32768),
        )

    def _layer_types(self) -> tuple[str, ...]:
        types = self.config.get("layer_types")
        if not types:
            pattern = int(self.cfg.get("sliding_window_pattern",
                                       self.cfg.get("_sliding_window_pattern", 6)))
            types = [SLIDING if (i + 1) % pattern else FULL for i in range(self.num_layers)]
        bad = sorted(set(types) - {SLIDING, FULL})
        if bad or len(types) != self.num_layers:
            raise self.cfg.unsupported("layer_types", types,
                                       f"need {self.num_layers} of {SLIDING!r}/{FULL!r}")
        return tuple(types)

    def forward(
        self,
        params: dict,
        kv_caches: tuple,  # per layer (pages [N, 2, Hkv, page_size, D], scales | None)
        token_ids: jax.Array,  # i32[T]
        meta: AttentionMetadata,
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> tuple[jax.Array, tuple]:  # hidden [T, H] (after the final norm), kv_caches
        self._check_kv_caches(kv_caches)
        x = jnp.take(params["embed_tokens"]["embedding"], token_ids, axis=0)
        x = x * jnp.asarray(self.hidden_size**0.5, x.dtype)
        ropes = {t: L.rope_cos_sin(meta.positions, f, x.dtype) for t, f in self.inv_freq.items()}

        def norm(p, y):
            return L.rms_norm(y, p["scale"], self.eps, add_unit_offset=True)

        new_caches = []
        for i, lp in enumerate(params["layers"]):
            attn = lp["attn"]

            def qk_norm(q, k, attn=attn):  # q [T, Hkv, G, D], k [T, Hkv, D]
                return norm(attn["q_norm"], q), norm(attn["k_norm"], k)

            h = norm(lp["input_layernorm"], x)
            a, cache = L.paged_attention(
                attn, h, kv_caches[i], meta, plan, sm_scale=self.sm_scale,
                rope=ropes[self.layer_types[i]], qk_norm=qk_norm,
                sliding_window=self.windows[i], soft_cap=self.attn_softcap,
            )
            new_caches.append(cache)
            x = x + norm(lp["post_attention_layernorm"], a)
            h = norm(lp["pre_feedforward_layernorm"], x)
            x = x + norm(lp["post_feedforward_layernorm"], L.gated_mlp(lp["mlp"], h, self.act, plan))
        return norm(params["norm"], x), tuple(new_caches)

    def params_from_hf(self, get: GetTensor) -> dict:
        hkv, d = self.num_kv_heads, self.head_dim
        layers = []
        for i in range(self.num_layers):
            pre = f"model.layers.{i}."
            at = pre + "self_attn."

            def s(name):
                return {"scale": get(name + ".weight")}

            layers.append({
                "input_layernorm": s(pre + "input_layernorm"),
                "attn": {
                    "qkv_proj": {"kernel": L.pack_qkv(get(at + "q_proj.weight"),
                                                      get(at + "k_proj.weight"),
                                                      get(at + "v_proj.weight"), hkv, d)},
                    "q_norm": s(at + "q_norm"),
                    "k_norm": s(at + "k_norm"),
                    "o_proj": {"kernel": get(at + "o_proj.weight").T},
                },
                "post_attention_layernorm": s(pre + "post_attention_layernorm"),
                "pre_feedforward_layernorm": s(pre + "pre_feedforward_layernorm"),
                "mlp": {
                    "gate_up": {"kernel": L.pack_gate_up(get(pre + "mlp.gate_proj.weight"),
                                                         get(pre + "mlp.up_proj.weight"))},
                    "down": {"kernel": get(pre + "mlp.down_proj.weight").T},
                },
                "post_feedforward_layernorm": s(pre + "post_feedforward_layernorm"),
            })
        params = {
            "embed_tokens": {"embedding": get("model.embed_tokens.weight")},
            "layers": layers,
            "norm": {"scale": get("model.norm.weight")},
        }
        return self._lm_head_from_hf(get, params)
