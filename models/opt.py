"""OPTForCausalLM: learned positions (offset 2), LayerNorm before or after each
block (``do_layer_norm_before``), optional project_in/out when
``word_embed_proj_dim != hidden_size``, tied LM head.

State:

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
from flax import nnx

from pagedjax.models import layers as L
from pagedjax.models import nn
from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from pagedjax.models.common import ConfigReader, DecoderLM, hf, hf_linear, make_info, qkv_spec

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding


class OPTBlock(nnx.Module):
    def __init__(self, h: int, nh: int, inter: int, act: str, pre_norm: bool, dtype):
        self.self_attn_layer_norm = nn.LayerNorm(h, 1e-5, dtype=dtype)
        self.attn = nn.Attention(h, nh, nh, h // nh, sm_scale=(h // nh)**-0.5, qkv_bias=True,
                                 o_bias=True, dtype=dtype)
        self.final_layer_norm = nn.LayerNorm(h, 1e-5, dtype=dtype)
        self.mlp = nn.PlainMLP(h, inter, act, dtype=dtype)
        self.pre_norm = pre_norm

    def __call__(self, x, cache, meta, plan, ctx):  # x [T, H]
        h = self.self_attn_layer_norm(x) if self.pre_norm else x
        a, cache = self.attn(h, cache, meta, plan)
        x = x + a
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        h = self.final_layer_norm(x) if self.pre_norm else x
        x = x + self.mlp(h, plan)
        if not self.pre_norm:
            x = self.final_layer_norm(x)
        return x, cache


class OPTForCausalLM(DecoderLM):
    architecture = "OPTForCausalLM"

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        c = ConfigReader(dict(config), self.architecture)
        self.hidden_size = h = int(c.require("hidden_size"))
        self.num_layers = int(c.require("num_hidden_layers"))
        self.num_heads = nh = int(c.require("num_attention_heads"))
        self.embed_dim = e = int(c.get("word_embed_proj_dim", h))
        pre_norm = bool(c.get("do_layer_norm_before", True))
        self.final_norm = pre_norm and not c.get("_remove_final_layer_norm", False)
        act = c.get("activation_function", "relu")
        L.activation(act)
        if not c.get("enable_bias", True):
            raise c.unsupported("enable_bias", False, "only true")
        if not c.get("layer_norm_elementwise_affine", True):
            raise c.unsupported("layer_norm_elementwise_affine", False, "only true")
        vocab = int(c.require("vocab_size"))
        max_len = int(c.get("max_position_embeddings", 2048))
        self.info = make_info(c.config, self.architecture, dtype, num_layers=self.num_layers,
                              num_q_heads=nh, num_kv_heads=nh, head_dim=h // nh, hidden_size=e,
                              vocab_size=vocab, max_model_len=max_len)
        self.embed_tokens = nn.Embed(vocab, e, dtype=dtype)
        self.embed_positions = nn.Embed(max_len + POSITION_OFFSET, h, dtype=dtype,
                                        axes=("pos", "embed"))
        proj = e != h
        self.project_in = nn.Linear(e, h, ("embed", "embed"), dtype=dtype) if proj else None
        self.project_out = nn.Linear(h, e, ("embed", "embed"), dtype=dtype) if proj else None
        inter = int(c.require("ffn_dim"))
        self.layers = nnx.List([OPTBlock(h, nh, inter, act, pre_norm, dtype)
                                for _ in range(self.num_layers)])
        self.final_layer_norm = nn.LayerNorm(h, 1e-5, dtype=dtype) if self.final_norm else None

    def embed(self, token_ids: jax.Array, meta: AttentionMetadata,
              plan: ExecutionPlan = DEFAULT_PLAN):  # i32[T] -> x [T, H], None
        x = self.embed_tokens(token_ids)  # [T, E]
        if self.project_in is not None:
            x = self.project_in(x, plan)  # [T, H]
        return x + self.embed_positions(meta.positions + POSITION_OFFSET, x.dtype), None

    def final(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:  # [T, E]
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x, plan)
        return x

    def weight_map(self) -> dict:
        pre = "model.decoder."
        nh, d = self.num_heads, self.hidden_size // self.num_heads

        def ln(me, name):
            return {me + ".scale": hf(name + ".weight"), me + ".bias": hf(name + ".bias")}

        def linear(me, name):
            return {me + ".kernel": hf_linear(name + ".weight"), me + ".bias": hf(name + ".bias")}

        out = {"embed_tokens.embedding": hf(pre + "embed_tokens.weight"),
               "embed_positions.embedding": hf(pre + "embed_positions.weight")}
        if self.project_in is not None:
            out["project_in.kernel"] = hf_linear(pre + "project_in.weight")
            out["project_out.kernel"] = hf_linear(pre + "project_out.weight")
        if self.final_norm:
            out.update(ln("final_layer_norm", pre + "final_layer_norm"))
        for i in range(self.num_layers):
            lp, me = f"{pre}layers.{i}.", f"layers.{i}."
            out.update({
                **ln(me + "self_attn_layer_norm", lp + "self_attn_layer_norm"),
                **ln(me + "final_layer_norm", lp + "final_layer_norm"),
                me + "attn.qkv_proj.kernel": qkv_spec(lp + "self_attn.", nh, d),
                me + "attn.qkv_proj.bias": qkv_spec(lp + "self_attn.", nh, d, "bias"),
                **linear(me + "attn.o_proj", lp + "self_attn.out_proj"),
                **linear(me + "mlp.fc1", lp + "fc1"), **linear(me + "mlp.fc2", lp + "fc2"),
            })
        return out
