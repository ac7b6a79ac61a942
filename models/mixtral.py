"""MixtralForCausalLM (Mixtral 8x7B / 8x22B): the Mistral attention of ``llama.py`` and a
sparse MLP on every layer (:class:`pagedjax.models.moe.SparseMoE`): top-k of the
router's softmax, always renormalised.

HF names: ``model.layers.{i}.block_sparse_moe.gate.weight`` [E, H] and
``block_sparse_moe.experts.{e}.w1`` (gate), ``w3`` (up), ``w2`` (down).
Config: ``num_local_experts``, ``num_experts_per_tok``, ``intermediate_size`` (per expert).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from pagedjax.models.common import hf_fused, hf_linear
from pagedjax.models.llama import MistralForCausalLM
from pagedjax.models.moe import SparseMoE
from pagedjax.models.qwen3_moe import MoEConfig, stack_down, stack_gate_up


class MixtralForCausalLM(MistralForCausalLM):
    architecture = "MixtralForCausalLM"
    supports_lora = False

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        self.moe = MoEConfig.parse({**config, "norm_topk_prob": True}, self.architecture,
                                   renormalize_default=True, inter_key="intermediate_size")
        super().__init__(config, dtype=dtype, rngs=rngs)

    def make_mlp(self, index: int, dtype) -> nnx.Module:
        m = self.moe
        return SparseMoE(self.hidden_size, m.inter, m.num_experts, m.top_k, self.act_name,
                         renormalize=True, dtype=dtype)

    def mlp_weight_map(self, i: int) -> dict:
        pre, me = f"model.layers.{i}.block_sparse_moe.", f"layers.{i}.mlp."
        ex = [f"{pre}experts.{e}." for e in range(self.moe.num_experts)]
        return {
            me + "gate.kernel": hf_linear(pre + "gate.weight"),
            me + "experts_gate_up": hf_fused(stack_gate_up, *[p + "w1.weight" for p in ex],
                                             *[p + "w3.weight" for p in ex]),
            me + "experts_down": hf_fused(stack_down, *[p + "w2.weight" for p in ex]),
        }
