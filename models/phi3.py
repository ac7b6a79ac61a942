"""Phi3ForCausalLM: the Llama layout with q/k/v and gate/up fused in the checkpoint
(``qkv_proj.weight`` [(Hq+2*Hkv)*D, H], ``gate_up_proj.weight`` [2*I, H]) and
LongRoPE ("su"/"longrope") rotary scaling.

LongRoPE: inverse frequencies divided by ``short_factor`` while a sequence is
at most ``original_max_position_embeddings`` tokens long and by
``long_factor`` beyond, cos/sin scaled by the attention factor
(sqrt(1 + ln(factor) / ln(original)) unless given). The choice is made per
sequence from its context length in this step, as transformers does for a
whole forward; keys written before a sequence crossed the boundary keep their
short-factor rotation (transformers recomputes the prompt at that point).
State as in ``llama.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pagedjax.models import layers as L
from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from pagedjax.models.common import ConfigReader, WeightSpec, hf_linear, pack_gate_up, pack_qkv
from pagedjax.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    architecture = "Phi3ForCausalLM"

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        self.long = None  # (long inverse frequencies, original max length) with LongRoPE
        super().__init__(config, dtype=dtype, rngs=rngs)

    def _rope(self, c: ConfigReader):
        theta, scaling = c.rope()
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        partial = float((scaling or {}).get("partial_rotary_factor",
                                            c.get("partial_rotary_factor", 1.0)))
        if partial != 1.0:
            raise c.unsupported("partial_rotary_factor", partial, "only 1.0")
        if kind not in ("longrope", "su"):
            return super()._rope(c)
        d = self.head_dim
        base = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
        orig = int(scaling.get("original_max_position_embeddings",
                               c.get("original_max_position_embeddings", 0)) or 0)
        if not orig:
            raise c.unsupported("rope_scaling", scaling, "longrope needs original_max_position_embeddings")
        factor = scaling.get("factor") or c.get("max_position_embeddings", orig) / orig
        att = scaling.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        short, long = (np.asarray(scaling[k], np.float64) for k in ("short_factor", "long_factor"))
        if short.shape != (d // 2,) or long.shape != (d // 2,):
            raise c.unsupported("rope_scaling", "short/long_factor",
                                f"need {d // 2} values each (head_dim / 2)")
        self.long = (tuple(map(float, 1.0 / (long * base))), orig)
        return tuple(map(float, 1.0 / (short * base))), float(att)

    def _sliding_windows(self, c: ConfigReader):
        window = c.get("sliding_window")
        return (None if window is None else int(window),) * self.num_layers

    def embed(self, token_ids: jax.Array, meta: AttentionMetadata,
              plan: ExecutionPlan = DEFAULT_PLAN):  # i32[T] -> x [T, H], (cos, sin [T, D/2])
        x, (cos, sin) = super().embed(token_ids, meta, plan)
        if self.long is None:
            return x, (cos, sin)
        inv_long, orig = self.long
        lc, ls = L.rope_cos_sin(meta.positions, jnp.asarray(inv_long, jnp.float32), x.dtype)
        t = token_ids.shape[0]
        seq = jnp.searchsorted(meta.cu_q_lens[1:], jnp.arange(t), side="right")  # i32[T]
        seq = jnp.minimum(seq, meta.kv_lens.shape[0] - 1)
        use_long = (meta.kv_lens[seq] > orig)[:, None]  # [T, 1]
        s = jnp.asarray(self.rope_scale, x.dtype)
        return x, (jnp.where(use_long, lc * s, cos), jnp.where(use_long, ls * s, sin))

    def layer_weight_map(self, i: int) -> dict:
        pre, me = f"model.layers.{i}.", f"layers.{i}."
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim

        def qkv(w):  # [(Hq + 2*Hkv)*D, H] -> [H, Hkv, G+2, D]
            q, k, v = np.split(w, [hq * d, (hq + hkv) * d], axis=0)
            return pack_qkv(q, k, v, hkv, d)

        def gate_up(w):  # [2*I, H] -> [H, 2, I]
            return pack_gate_up(*np.split(w, 2, axis=0))

        out = super().layer_weight_map(i)
        out.update({
            me + "attn.qkv_proj.kernel": WeightSpec((pre + "self_attn.qkv_proj.weight",), qkv),
            me + "mlp.gate_up.kernel": WeightSpec((pre + "mlp.gate_up_proj.weight",), gate_up),
            me + "attn.o_proj.kernel": hf_linear(pre + "self_attn.o_proj.weight"),
        })
        return out
