"""GPT2LMHeadModel: learned positions, pre-LayerNorm blocks, tied LM head.

HF GPT-2 stores its projections as ``Conv1D`` ([in, out], already our
``kernel`` layout). Parameter tree:

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

from models import layers as L
from models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from models.common import CausalLM, GetTensor


class GPT2LMHeadModel(CausalLM):
    architecture = "GPT2LMHeadModel"

    def __init__(self, config: dict, dtype=jnp.float32, eos_token_ids=None):
        super().__init__(config, dtype, eos_token_ids)
        c = self.cfg
        self.hidden_size = int(c.get("n_embd", c.get("hidden_size", 768)))
        self.num_layers = int(c.get("n_layer", c.get("num_hidden_layers", 12)))
        self.num_heads = int(c.get("n_head", c.get("num_attention_heads", 12)))
        self.head_dim = self.hidden_size // self.num_heads
        self.eps = float(c.get("layer_norm_epsilon", 1e-5))
        self.act = L.activation(c.get("activation_function", "gelu_new"))
        if c.get("scale_attn_by_inverse_layer_idx", False):
            raise c.unsupported("scale_attn_by_inverse_layer_idx", True, "only false")
        if c.get("add_cross_attention", False):
            raise c.unsupported("add_cross_attention", True, "only false")
        scale = c.get("scale_attn_weights", True)
        self.sm_scale = self.head_dim**-0.5 if scale else 1.0
        self.tie_word_embeddings = True
        self.info = self._make_info(
            num_layers=self.num_layers, num_q_heads=self.num_heads, num_kv_heads=self.num_heads,
            head_dim=self.head_dim, hidden_size=self.hidden_size,
            vocab_size=c.require("vocab_size"),
            max_model_len=c.get("n_positions", c.get("max_position_embeddings", 1024)),
        )

    def forward(
        self,
        params: dict,
        kv_caches: tuple,  # per layer (pages [N, 2, Hq, page_size, D], scales | None)
        token_ids: jax.Array,  # i32[T]
        meta: AttentionMetadata,
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> tuple[jax.Array, tuple]:  # hidden [T, H] (after ln_f), kv_caches
        self._check_kv_caches(kv_caches)
        x = jnp.take(params["embed_tokens"]["embedding"], token_ids, axis=0)
        x = x + jnp.take(params["embed_positions"]["embedding"], meta.positions, axis=0)
        new_caches = []
        for i, lp in enumerate(params["layers"]):
            h = L.layer_norm(x, lp["ln_1"]["scale"], lp["ln_1"]["bias"], self.eps)
            a, cache = L.paged_attention(lp["attn"], h, kv_caches[i], meta, plan, sm_scale=self.sm_scale)
            new_caches.append(cache)
            x = x + a
            h = L.layer_norm(x, lp["ln_2"]["scale"], lp["ln_2"]["bias"], self.eps)
            x = x + L.plain_mlp(lp["mlp"], h, self.act, plan)
        x = L.layer_norm(x, params["ln_f"]["scale"], params["ln_f"]["bias"], self.eps)
        return x, tuple(new_caches)

    def params_from_hf(self, get: GetTensor) -> dict:
        h, nh, d = self.hidden_size, self.num_heads, self.head_dim

        def ln(name):
            return {"scale": get(name + ".weight"), "bias": get(name + ".bias")}

        def conv(name):
            return {"kernel": get(name + ".weight"), "bias": get(name + ".bias")}

        layers = []
        for i in range(self.num_layers):
            pre = f"transformer.h.{i}."
            w = get(pre + "attn.c_attn.weight").reshape(h, 3, nh, d).transpose(0, 2, 1, 3)
            b = get(pre + "attn.c_attn.bias").reshape(3, nh, d).transpose(1, 0, 2)
            layers.append({
                "ln_1": ln(pre + "ln_1"),
                "attn": {
                    "qkv_proj": {"kernel": np.ascontiguousarray(w), "bias": np.ascontiguousarray(b)},
                    "o_proj": conv(pre + "attn.c_proj"),
                },
                "ln_2": ln(pre + "ln_2"),
                "mlp": {"fc1": conv(pre + "mlp.c_fc"), "fc2": conv(pre + "mlp.c_proj")},
            })
        return {
            "embed_tokens": {"embedding": get("transformer.wte.weight")},
            "embed_positions": {"embedding": get("transformer.wpe.weight")},
            "layers": layers,
            "ln_f": ln("transformer.ln_f"),
        }
