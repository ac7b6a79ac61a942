"""Sparse mixture-of-experts MLP: a router picks ``top_k`` experts per token, tokens are
grouped by expert and each expert multiplies only its own tokens
(``pagedjax.kernels_pallas.grouped_matmul``; no path runs every expert on every token).

State (logical axes in parentheses, see ``pagedjax/distributed/sharding.py``):

    gate.kernel         [H, E]        (embed, None)          the router
    experts_gate_up     [E, H, 2, I]  (experts, embed, None, mlp)
    experts_down        [E, I, H]     (experts, mlp, embed)
    shared_expert       GatedMLP      (Qwen2-MoE only) with shared_expert_gate.kernel [H, 1]

Routing: softmax over the E router logits (float32), the top_k, renormalised to sum
to one when ``renormalize`` (Mixtral always; Qwen3-MoE with ``norm_topk_prob``).

Under a mesh (``plan.mesh``) the experts run per device in ``shard_map``: with
``plan.expert_parallel`` each device holds E/N whole experts and computes the
tokens routed to them; otherwise each device holds 1/N of every expert's
intermediate size. Either way the partial outputs are summed with one ``psum``.
Shapes are static: T tokens make T * top_k sorted rows whatever the routing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from pagedjax.kernels_pallas.grouped_matmul import grouped_matmul
from pagedjax.models import layers as L
from pagedjax.models import nn
from pagedjax.models.base import DEFAULT_PLAN, ExecutionPlan


def route(
    logits: jax.Array,  # f32[T, E]
    top_k: int,
    renormalize: bool,
) -> tuple[jax.Array, jax.Array]:  # weights f32[T, k], expert ids i32[T, k]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, ids = jax.lax.top_k(probs, top_k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, ids.astype(jnp.int32)


def expert_mlp(
    x: jax.Array,  # [T, H]
    weights: jax.Array,  # f32[T, k]
    ids: jax.Array,  # i32[T, k] global expert ids
    w_gate_up: jax.Array,  # [El, H, 2, I']   this device's experts (El = E or E/N)
    w_down: jax.Array,  # [El, I', H]
    act,
    first: jax.Array | int = 0,  # global id of w_gate_up[0]
    impl: str = "auto",
) -> jax.Array:  # [T, H] sum over the token's experts held here
    t, k = ids.shape
    n_local, h = w_gate_up.shape[0], w_gate_up.shape[1]
    inter = w_gate_up.shape[3]
    local = ids.reshape(-1) - first
    key = jnp.where((local >= 0) & (local < n_local), local, n_local)  # elsewhere: last
    order = jnp.argsort(key, stable=True)
    sizes = jnp.zeros((n_local,), jnp.int32).at[key].add(1, mode="drop")
    token = order // k
    xs = jnp.take(x, token, axis=0)  # [T*k, H] grouped by expert
    gu = grouped_matmul(xs, w_gate_up.reshape(n_local, h, 2 * inter), sizes, impl)
    gu = gu.reshape(-1, 2, inter)
    ys = grouped_matmul(act(gu[:, 0]) * gu[:, 1], w_down, sizes, impl)  # [T*k, H]
    wk = jnp.where(key[order] < n_local, weights.reshape(-1)[order], 0.0)
    ys = ys.astype(jnp.float32) * wk[:, None]
    return jnp.zeros((t, h), jnp.float32).at[token].add(ys).astype(x.dtype)


class SparseMoE(nnx.Module):
    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int, act: str, *,
                 renormalize: bool, shared_inter: int = 0, dtype=jnp.float32):
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be in [1, num_experts="
                             f"{num_experts}]")
        self.gate = nn.Linear(hidden, num_experts, ("embed", None), dtype=dtype)
        self.experts_gate_up = nn.param((num_experts, hidden, 2, inter), dtype,
                                        ("experts", "embed", None, "mlp"))
        self.experts_down = nn.param((num_experts, inter, hidden), dtype,
                                     ("experts", "mlp", "embed"))
        self.shared_expert = nn.GatedMLP(hidden, shared_inter, act, dtype=dtype) \
            if shared_inter else None
        self.shared_expert_gate = nn.Linear(hidden, 1, ("embed", None), dtype=dtype) \
            if shared_inter else None
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.act = L.activation(act)

    def __call__(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN,
                 lora_slots: jax.Array | None = None) -> jax.Array:  # x [T, H] -> [T, H]
        logits = self.gate(x, plan)
        weights, ids = route(logits, self.top_k, self.renormalize)
        wgu, wd = self.experts_gate_up[...], self.experts_down[...]
        if plan.mesh is None:
            y = expert_mlp(x, weights, ids, wgu, wd, self.act, 0, plan.moe_impl)
        else:
            y = self._sharded(x, weights, ids, wgu, wd, plan)
        if self.shared_expert is not None:
            gate = jax.nn.sigmoid(self.shared_expert_gate(x, plan).astype(jnp.float32))
            y = y + (gate * self.shared_expert(x, plan).astype(jnp.float32)).astype(y.dtype)
        return y

    def _sharded(self, x, weights, ids, wgu, wd, plan):
        from jax.sharding import PartitionSpec as P

        mesh, axis = plan.mesh, plan.tp_axis
        n = mesh.shape[axis]
        if plan.expert_parallel:
            if self.num_experts % n:
                raise ValueError(f"enable_expert_parallel: num_experts={self.num_experts} is "
                                 f"not divisible by the {n} devices")
            specs = (P(axis), P(axis))
            per = self.num_experts // n
        elif wd.shape[1] % n == 0:  # each expert's intermediate size split (as the weights are)
            specs = (P(None, None, None, axis), P(None, axis))
            per = 0
        else:  # the weights are replicated: every device computes the whole layer
            return expert_mlp(x, weights, ids, wgu, wd, self.act, 0, plan.moe_impl)

        def body(x, weights, ids, wgu, wd):
            first = jax.lax.axis_index(axis) * per if per else 0
            y = expert_mlp(x, weights, ids, wgu, wd, self.act, first, plan.moe_impl)
            return jax.lax.psum(y.astype(jnp.float32), axis).astype(x.dtype)

        f = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(), *specs), out_specs=P(),
                          check_vma=False)
        return f(x, weights, ids, wgu, wd)
