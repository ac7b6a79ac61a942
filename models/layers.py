"""Building blocks shared by the model files: norms, rotary, MLPs, paged attention.

Pure functions of arrays. Parameter layouts (``kernel`` is always [in, ...out]):

    qkv_proj.kernel  [H, Hkv, G+2, D]   fused q/k/v, grouped by KV head: slot
                                        g < G of group k is query head k*G+g,
                                        slot G its key, slot G+1 its value
    qkv_proj.bias    [Hkv, G+2, D]      (Qwen2, GPT-2, OPT)
    o_proj.kernel    [Hq*D, H]
    gate_up.kernel   [H, 2, I]          gated MLP: [:, 0] gate, [:, 1] up
    down.kernel      [I, H]

Grouping q/k/v by KV head makes the projection one matmul and keeps
tensor-parallel sharding trivial: splitting axis 1 of ``qkv_proj`` (and axis 0
of ``o_proj``, axis 2 of ``gate_up``, axis 0 of ``down``) into N parts gives
each device whole heads, matching the KV pool split by KV head.

Norms and softmax statistics are computed in float32; matmuls run in the
parameter dtype (float32 on CPU).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import kernels_pallas
from models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan

Params = dict


# ----------------------------------------------------------------------------- norms


def rms_norm(
    x: jax.Array,  # [T, H] (or [..., H])
    weight: jax.Array,  # [H]
    eps: float,
    *,
    add_unit_offset: bool = False,  # Gemma: scale by (1 + weight)
) -> jax.Array:  # [..., H], x.dtype
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    w = weight.astype(jnp.float32)
    if add_unit_offset:
        w = 1.0 + w
    return (xf * w).astype(x.dtype)


def layer_norm(
    x: jax.Array,  # [..., H]
    weight: jax.Array | None,  # [H]
    bias: jax.Array | None,  # [H]
    eps: float,
) -> jax.Array:  # [..., H], x.dtype
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    xc = xf - mean
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    y = xc * jax.lax.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


# ----------------------------------------------------------------------------- rotary


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """Inverse frequencies f32[D/2] for neox-style rotary, with HF rope scaling.

    Supported ``scaling["rope_type"]``: default, linear, llama3.
    """
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        pass
    elif kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        lo = float(scaling.get("low_freq_factor", 1.0))
        hi = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > old_len / lo, inv / factor, inv)
        mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        inv = np.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    else:
        raise ValueError(
            f"rope_scaling: rope_type {kind!r} is not supported (supported: default, linear, llama3)"
        )
    return inv.astype(np.float32)


def rope_cos_sin(
    positions: jax.Array,  # i32[T]
    inv_freq: np.ndarray,  # f32[D/2]
    dtype,
) -> tuple[jax.Array, jax.Array]:  # cos, sin [T, D/2]
    angles = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    if jax.default_backend() != "cpu":
        return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)
    # XLA:CPU fuses cos/sin into every layer's rotary and recomputes them per
    # element of q and k in each layer (~15 ms of a 64-row decode step on a
    # 2-core CPU; optimization_barrier is stripped before fusion on CPU). A
    # one-trip loop whose trip count the compiler cannot see computes them once.
    # (CPU only: on GPU a data-dependent loop trip count can cost a device->host sync.)
    def body(_, carry):
        return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)

    zero = jnp.zeros(angles.shape, dtype)
    trips = (positions[:1].sum() >= 0).astype(jnp.int32)  # 1, unknown to the compiler
    return jax.lax.fori_loop(0, trips, body, (zero, zero))


def apply_rotary(
    x: jax.Array,  # [T, ..., D]
    cos: jax.Array,  # [T, D/2]
    sin: jax.Array,  # [T, D/2]
) -> jax.Array:  # [T, ..., D]
    """Neox-style rotary: rotate the two halves of the head dimension."""
    half = x.shape[-1] // 2
    shape = (cos.shape[0],) + (1,) * (x.ndim - 2) + (half,)
    c, s = cos.reshape(shape), sin.reshape(shape)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


# ----------------------------------------------------------------------------- MLPs

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    if name not in ACTIVATIONS:
        raise ValueError(
            f"hidden_act: {name!r} is not supported (supported: {sorted(ACTIVATIONS)})"
        )
    return ACTIVATIONS[name]


# Decode steps multiply a handful of rows by every weight, where XLA:CPU's
# GEMM runs well below the memory-bandwidth limit; the runner's plan routes
# float32 matmuls of at most ``plan.native_matmul_rows`` rows to the C++ kernel
# (kernels_pallas/cpu_native.cc) on the cpu_native backend.


def _native(x: jax.Array, w: jax.Array, plan: ExecutionPlan) -> bool:
    f32 = jnp.dtype(jnp.float32)
    return 0 < x.shape[0] <= plan.native_matmul_rows and x.dtype == f32 and w.dtype == f32


def matmul(x: jax.Array, w: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN, *,
           transposed: bool = False) -> jax.Array:
    """``x [T, In] @ w [In, ...Out]`` -> ``[T, ...Out]``, or ``x @ w[Out, In].T``
    when ``transposed``."""
    if _native(x, w, plan):
        from kernels_pallas import cpu_native

        w2 = w if transposed else w.reshape(w.shape[0], -1)
        y = cpu_native.matmul(x, w2, transposed=transposed)
        return y if transposed else y.reshape(x.shape[0], *w.shape[1:])
    if transposed:
        return jnp.einsum("ti,oi->to", x, w)
    return jnp.tensordot(x, w, axes=1)


def dense(
    p: Params,  # {"kernel": [In, Out], "bias"?: [Out]}
    x: jax.Array,  # [T, In]
    plan: ExecutionPlan = DEFAULT_PLAN,
) -> jax.Array:  # [T, Out]
    y = matmul(x, p["kernel"], plan)
    if "bias" in p:
        y = y + p["bias"]
    return y


def gated_mlp(
    p: Params,  # {"gate_up": {"kernel": [H, 2, I]}, "down": {"kernel": [I, H]}}
    x: jax.Array,  # [T, H]
    act: Callable[[jax.Array], jax.Array],
    plan: ExecutionPlan = DEFAULT_PLAN,
) -> jax.Array:  # [T, H]
    gu = matmul(x, p["gate_up"]["kernel"], plan)  # [T, 2, I]
    return dense(p["down"], act(gu[:, 0]) * gu[:, 1], plan)


def plain_mlp(
    p: Params,  # {"fc1": {"kernel": [H, I], "bias": [I]}, "fc2": {"kernel": [I, H], ...}}
    x: jax.Array,  # [T, H]
    act: Callable[[jax.Array], jax.Array],
    plan: ExecutionPlan = DEFAULT_PLAN,
) -> jax.Array:  # [T, H]
    return dense(p["fc2"], act(dense(p["fc1"], x, plan)), plan)


# ----------------------------------------------------------------------------- attention


def qkv_projection(
    p: Params,  # {"kernel": [H, Hkv, G+2, D], "bias"?: [Hkv, G+2, D]}
    x: jax.Array,  # [T, H]
    plan: ExecutionPlan = DEFAULT_PLAN,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # q [T, Hkv, G, D], k, v [T, Hkv, D]
    y = matmul(x, p["kernel"], plan)  # [T, Hkv, G+2, D]
    if "bias" in p:
        y = y + p["bias"]
    g = y.shape[2] - 2
    return y[:, :, :g], y[:, :, g], y[:, :, g + 1]


def paged_attention(
    p: Params,  # {"qkv_proj": ..., "o_proj": {"kernel": [Hq*D, H], "bias"?: [H]}}
    x: jax.Array,  # [T, H] (already normed)
    cache: tuple[jax.Array, jax.Array | None],  # pages [N, 2, Hkv, page_size, D], scales
    meta: AttentionMetadata,
    plan: ExecutionPlan = DEFAULT_PLAN,
    *,
    sm_scale: float,
    rope: tuple[jax.Array, jax.Array] | None = None,  # cos, sin [T, D/2]
    qk_norm: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]] | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array | None]]:  # out [T, H], cache
    """Project q/k/v, rotate, write K/V to the pool, attend, project out.

    The kernel is ``plan.attention_fn`` when set, else
    ``kernels_pallas.ragged_paged_attention``, run per device through
    ``shard_map`` over KV heads under tensor parallelism (custom kernels only;
    GSPMD partitions the ``xla`` backend by itself).
    """
    t = x.shape[0]
    q, k, v = qkv_projection(p["qkv_proj"], x, plan)  # [T, Hkv, G, D], [T, Hkv, D] x2
    if qk_norm is not None:
        q, k = qk_norm(q, k)
    if rope is not None:
        q = apply_rotary(q, *rope)
        k = apply_rotary(k, *rope)
    pages, scales = cache
    pages, scales = kernels_pallas.write_kv(pages, scales, k, v, meta.slot_mapping)
    hkv, g, d = q.shape[1:]
    attend = attention_kernel(plan)
    out = attend(
        q.reshape(t, hkv * g, d),
        pages,
        meta.kv_lens,
        meta.page_table,
        meta.cu_q_lens,
        meta.num_seqs,
        sm_scale=sm_scale,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        kv_scales=scales,
        max_q_len=meta.max_q_len,
        backend=plan.attn_backend,
    )  # [T, Hq, D]
    return dense(p["o_proj"], out.reshape(t, hkv * g * d), plan), (pages, scales)


def attention_kernel(plan: ExecutionPlan) -> Callable:
    """The ragged paged-attention callable a plan asks for (see paged_attention)."""
    if plan.attention_fn is not None:
        return plan.attention_fn
    if plan.mesh is not None and plan.attn_backend != "xla":
        return kernels_pallas.sharded_attention(plan.mesh, plan.tp_axis)
    return kernels_pallas.ragged_paged_attention


# ----------------------------------------------------------------------------- weight packing
# numpy helpers the loaders use to turn HF tensors ([out, in] Linear weights)
# into the layouts above.


def pack_qkv(
    q: np.ndarray,  # [Hq*D, H]   HF Linear layout ([out, in])
    k: np.ndarray,  # [Hkv*D, H]
    v: np.ndarray,  # [Hkv*D, H]
    num_kv_heads: int,
    head_dim: int,
) -> np.ndarray:  # [H, Hkv, G+2, D]
    h = q.shape[1]
    g = q.shape[0] // (num_kv_heads * head_dim)
    qg = q.reshape(num_kv_heads, g, head_dim, h)
    kg = k.reshape(num_kv_heads, 1, head_dim, h)
    vg = v.reshape(num_kv_heads, 1, head_dim, h)
    return np.ascontiguousarray(np.concatenate([qg, kg, vg], axis=1).transpose(3, 0, 1, 2))


def pack_qkv_bias(
    q: np.ndarray,  # [Hq*D]
    k: np.ndarray,  # [Hkv*D]
    v: np.ndarray,  # [Hkv*D]
    num_kv_heads: int,
    head_dim: int,
) -> np.ndarray:  # [Hkv, G+2, D]
    g = q.shape[0] // (num_kv_heads * head_dim)
    return np.concatenate(
        [
            q.reshape(num_kv_heads, g, head_dim),
            k.reshape(num_kv_heads, 1, head_dim),
            v.reshape(num_kv_heads, 1, head_dim),
        ],
        axis=1,
    )


def pack_gate_up(
    gate: np.ndarray,  # [I, H]  HF Linear layout
    up: np.ndarray,  # [I, H]
) -> np.ndarray:  # [H, 2, I]
    return np.ascontiguousarray(np.stack([gate.T, up.T], axis=1))
