"""Mixture-of-experts Qwen: Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B) and
Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B, with a gated shared expert).

The Qwen3 / Qwen2 attention of ``qwen2.py``; the MLP of a sparse layer is a
:class:`pagedjax.models.moe.SparseMoE` (state and routing there). A layer is sparse
unless listed in ``mlp_only_layers``, on every ``decoder_sparse_step``-th layer.
Config: ``num_experts`` (or ``num_local_experts``), ``num_experts_per_tok``,
``moe_intermediate_size``, ``norm_topk_prob`` (renormalise the top-k weights),
``shared_expert_intermediate_size`` (Qwen2-MoE).

HF names: ``model.layers.{i}.mlp.gate.weight`` [E, H], ``mlp.experts.{e}.{gate,up,down}_proj.weight``,
``mlp.shared_expert.*`` and ``mlp.shared_expert_gate.weight`` [1, H].
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from pagedjax.models.common import ConfigReader, hf_fused, hf_linear, pack_gate_up
from pagedjax.models.moe import SparseMoE
from pagedjax.models.qwen2 import Qwen2ForCausalLM, Qwen3ForCausalLM


def stack_gate_up(*ws: np.ndarray) -> np.ndarray:  # E gate [I, H], then E up -> [E, H, 2, I]
    e = len(ws) // 2
    return np.ascontiguousarray(np.stack([pack_gate_up(g, u) for g, u in zip(ws[:e], ws[e:])]))


def stack_down(*ws: np.ndarray) -> np.ndarray:  # E down [H, I] -> [E, I, H]
    return np.ascontiguousarray(np.stack([w.T for w in ws]))


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """The sparse-MLP fields of an HF config (hashable: the module graph holds it)."""

    num_experts: int
    top_k: int
    inter: int
    renormalize: bool
    shared_inter: int
    sparse: tuple[bool, ...]  # per layer

    @classmethod
    def parse(cls, config: dict, arch: str, *, renormalize_default: bool,
              inter_key: str = "moe_intermediate_size") -> "MoEConfig":
        c = ConfigReader(dict(config), arch)
        num_layers = int(c.require("num_hidden_layers"))
        experts = int(c.get("num_experts", c.get("num_local_experts", 0)))
        if experts < 1:
            raise ValueError(f"{arch} config: num_experts (or num_local_experts) is missing")
        step = int(c.get("decoder_sparse_step", 1)) or 1
        only = set(c.get("mlp_only_layers", []) or [])
        return cls(num_experts=experts, top_k=int(c.require("num_experts_per_tok")),
                   inter=int(c.require(inter_key)),
                   renormalize=bool(c.get("norm_topk_prob", renormalize_default)),
                   shared_inter=int(c.get("shared_expert_intermediate_size", 0)),
                   sparse=tuple(i not in only and (i + 1) % step == 0
                                for i in range(num_layers)))


class _QwenMoE:
    """The sparse MLP of the Qwen MoE models (mixed into the Qwen2/Qwen3 classes)."""

    supports_lora = False
    renormalize_default = False

    def _moe(self, config: dict) -> MoEConfig:
        return MoEConfig.parse(config, self.architecture,
                               renormalize_default=self.renormalize_default)

    def make_mlp(self, index: int, dtype) -> nnx.Module:
        m = self.moe
        if not m.sparse[index]:
            return super().make_mlp(index, dtype)
        return SparseMoE(self.hidden_size, m.inter, m.num_experts, m.top_k, self.act_name,
                         renormalize=m.renormalize, shared_inter=m.shared_inter, dtype=dtype)

    def mlp_weight_map(self, i: int) -> dict:
        m = self.moe
        if not m.sparse[i]:
            return super().mlp_weight_map(i)
        pre, me = f"model.layers.{i}.mlp.", f"layers.{i}.mlp."
        ex = [f"{pre}experts.{e}." for e in range(m.num_experts)]
        out = {
            me + "gate.kernel": hf_linear(pre + "gate.weight"),
            me + "experts_gate_up": hf_fused(stack_gate_up, *[p + "gate_proj.weight" for p in ex],
                                             *[p + "up_proj.weight" for p in ex]),
            me + "experts_down": hf_fused(stack_down, *[p + "down_proj.weight" for p in ex]),
        }
        if m.shared_inter:
            sp = pre + "shared_expert."
            out.update({
                me + "shared_expert.gate_up.kernel": hf_fused(
                    pack_gate_up, sp + "gate_proj.weight", sp + "up_proj.weight"),
                me + "shared_expert.down.kernel": hf_linear(sp + "down_proj.weight"),
                me + "shared_expert_gate.kernel": hf_linear(pre + "shared_expert_gate.weight"),
            })
        return out


class Qwen3MoeForCausalLM(_QwenMoE, Qwen3ForCausalLM):
    architecture = "Qwen3MoeForCausalLM"

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        self.moe = self._moe(config)
        super().__init__(config, dtype=dtype, rngs=rngs)


class Qwen2MoeForCausalLM(_QwenMoE, Qwen2ForCausalLM):
    architecture = "Qwen2MoeForCausalLM"

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        self.moe = self._moe(config)
        super().__init__(config, dtype=dtype, rngs=rngs)
