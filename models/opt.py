"""OPTForCausalLM: learned positions (offset 2), LayerNorm before or after each
block (``do_layer_norm_before``), optional project_in/out when
``word_embed_proj_dim != hidden_size``, tied LM head.

Parameter tree:

    embed_tokens.embedding            [V, E]      (E = word_embed_proj_dim)
    embed_positions.embedding         [P+2, H]
    project_in.kernel [E, H], project_out.kernel [H, E]   (only when E != H)
    layers[i].self_attn_layer_norm.{scale,bias}   [H]
    layers[i].attn.qkv_proj.{kernel [H, Hq, 3, D], bias [Hq, 3, D]}
    layers[i].attn.o_proj.{kernel [H, H], bias [H]}
    layers[i].final_layer_norm.{scale,bias}       [H]
    layers[i].mlp.fc1.{kernel [H, I], bias}, mlp.fc2.{kernel [I, H], bias}
    final_layer_norm.{scale,bias}     [H]   (pre-norm models only)

``forward`` returns hidden states after project_out, i.e. [T, E].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models import layers as L
from models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from models.common import CausalLM, GetTensor

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding


class OPTForCausalLM(CausalLM):
    architecture = "OPTForCausalLM"

    def __init__(self, config: dict, dtype=jnp.float32, eos_token_ids=None):
        super().__init__(config, dtype, eos_token_ids)
        c = self.cfg
        self.hidden_size = int(c.require("hidden_size"))
        self.num_layers = int(c.require("num_hidden_layers"))
        self.num_heads = int(c.require("num_attention_heads"))
        self.head_dim = self.hidden_size // self.num_heads
        self.embed_dim = int(c.get("word_embed_proj_dim", self.hidden_size))
        self.pre_norm = bool(c.get("do_layer_norm_before", True))
        self.final_norm = self.pre_norm and not c.get("_remove_final_layer_norm", False)
        self.act = L.activation(c.get("activation_function", "relu"))
        if not c.get("enable_bias", True):
            raise c.unsupported("enable_bias", False, "only true")
        if not c.get("layer_norm_elementwise_affine", True):
            raise c.unsupported("layer_norm_elementwise_affine", False, "only true")
        self.eps = 1e-5
        self.sm_scale = self.head_dim**-0.5
        self.tie_word_embeddings = True
        self.info = self._make_info(
            num_layers=self.num_layers, num_q_heads=self.num_heads, num_kv_heads=self.num_heads,
            head_dim=self.head_dim, hidden_size=self.embed_dim,
            vocab_size=c.require("vocab_size"),
            max_model_len=c.get("max_position_embeddings", 2048),
        )

    def forward(
        self,
        params: dict,
        kv_caches: tuple,  # per layer (pages [N, 2, Hq, page_size, D], scales | None)
        token_ids: jax.Array,  # i32[T]
        meta: AttentionMetadata,
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> tuple[jax.Array, tuple]:  # hidden [T, E], kv_caches
        self._check_kv_caches(kv_caches)
        x = jnp.take(params["embed_tokens"]["embedding"], token_ids, axis=0)  # [T, E]
        if "project_in" in params:
            x = L.dense(params["project_in"], x, plan)  # [T, H]
        pos = meta.positions + POSITION_OFFSET
        x = x + jnp.take(params["embed_positions"]["embedding"], pos, axis=0)

        def ln(p, y):
            return L.layer_norm(y, p["scale"], p["bias"], self.eps)

        new_caches = []
        for i, lp in enumerate(params["layers"]):
            h = ln(lp["self_attn_layer_norm"], x) if self.pre_norm else x
            a, cache = L.paged_attention(lp["attn"], h, kv_caches[i], meta, plan, sm_scale=self.sm_scale)
            new_caches.append(cache)
            x = x + a
            if not self.pre_norm:
                x = ln(lp["self_attn_layer_norm"], x)
            h = ln(lp["final_layer_norm"], x) if self.pre_norm else x
            x = x + L.plain_mlp(lp["mlp"], h, self.act, plan)
            if not self.pre_norm:
                x = ln(lp["final_layer_norm"], x)
        if self.final_norm:
            x = ln(params["final_layer_norm"], x)
        if "project_out" in params:
            x = L.dense(params["project_out"], x, plan)  # [T, E]
        return x, tuple(new_caches)

    def params_from_hf(self, get: GetTensor) -> dict:
        nh, d = self.num_heads, self.head_dim
        pre = "model.decoder."

        def ln(name):
            return {"scale": get(name + ".weight"), "bias": get(name + ".bias")}

        def linear(name):
            return {"kernel": get(name + ".weight").T, "bias": get(name + ".bias")}

        layers = []
        for i in range(self.num_layers):
            lp = f"{pre}layers.{i}."
            at = lp + "self_attn."
            qkv = L.pack_qkv(get(at + "q_proj.weight"), get(at + "k_proj.weight"),
                             get(at + "v_proj.weight"), nh, d)
            qkv_b = L.pack_qkv_bias(get(at + "q_proj.bias"), get(at + "k_proj.bias"),
                                    get(at + "v_proj.bias"), nh, d)
            layers.append({
                "self_attn_layer_norm": ln(lp + "self_attn_layer_norm"),
                "attn": {"qkv_proj": {"kernel": qkv, "bias": qkv_b},
                         "o_proj": linear(at + "out_proj")},
                "final_layer_norm": ln(lp + "final_layer_norm"),
                "mlp": {"fc1": linear(lp + "fc1"), "fc2": linear(lp + "fc2")},
            })
        params = {
            "embed_tokens": {"embedding": get(pre + "embed_tokens.weight")},
            "embed_positions": {"embedding": get(pre + "embed_positions.weight")},
            "layers": layers,
        }
        if self.embed_dim != self.hidden_size:
            params["project_in"] = {"kernel": get(pre + "project_in.weight").T}
            params["project_out"] = {"kernel": get(pre + "project_out.weight").T}
        if self.final_norm:
            params["final_layer_norm"] = ln(pre + "final_layer_norm")
        return params
