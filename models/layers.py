"""Pure functions the NNX layers (``models/nn.py``) are made of: norms, rotary,
activations, the matmul (routed by the plan), the attention kernel choice.

Norms and softmax statistics are computed in float32; matmuls run in the
parameter dtype (float32 on CPU).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import pagedjax.kernels_pallas as kernels_pallas
from pagedjax.models.base import DEFAULT_PLAN, ExecutionPlan


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
# (kernels_pallas/cpu/matmul.cc) on the cpu_native backend; int8 and GGUF block weights
# go to their own C++ kernels (qmatmul.cc, blockmatmul.cc) up to their own measured
# limits (plan.int8_matmul_rows, plan.block_matmul_rows).


def _native(x: jax.Array, w: jax.Array, plan: ExecutionPlan) -> bool:
    f32 = jnp.dtype(jnp.float32)
    return 0 < x.shape[0] <= plan.native_matmul_rows and x.dtype == f32 and w.dtype == f32


def native_int8(x: jax.Array, plan: ExecutionPlan) -> bool:
    """Whether ``x``'s product with an int8 weight runs in the C++ kernel: at most
    ``plan.int8_matmul_rows`` float32 rows (None: the float32 limit), on one device."""
    limit = plan.native_matmul_rows if plan.int8_matmul_rows is None else plan.int8_matmul_rows
    return plan.mesh is None and 0 < x.shape[0] <= limit and x.dtype == jnp.dtype(jnp.float32)


def int8_matmul(x: jax.Array, q: jax.Array, scale: jax.Array, *,
                transposed: bool = False) -> jax.Array:
    """``(x [T, In] @ q [In, ...Out]) * scale [...Out]`` in the C++ int8 kernel
    (kernels_pallas/cpu/qmatmul.cc), or ``x @ q[Out, In].T * scale[Out]`` when
    ``transposed`` (the tied LM head) -> ``[T, ...Out]``."""
    from pagedjax.kernels_pallas.cpu import qmatmul as cpu_qmatmul

    if transposed:
        return cpu_qmatmul.qmatmul(x, q, scale, transposed=True)
    y = cpu_qmatmul.qmatmul(x, q.reshape(q.shape[0], -1), scale.reshape(-1))
    return y.reshape(x.shape[0], *q.shape[1:])


def native_block(x: jax.Array, plan: ExecutionPlan) -> bool:
    """Whether ``x``'s product with a GGUF block-quantized weight runs in the C++ block
    kernel: at most ``plan.block_matmul_rows`` float32 rows, on one device."""
    return (plan.mesh is None and 0 < x.shape[0] <= plan.block_matmul_rows
            and x.dtype == jnp.dtype(jnp.float32))


def block_matmul(x: jax.Array, kind: str, comps: dict, *, transposed: bool = False) -> jax.Array:
    """``x [T, In] @ W [In, ...Out]`` for W given by GGUF block components quantized
    along In (models/quant.py) in the C++ block kernel
    (kernels_pallas/cpu/blockmatmul.cc), or ``x @ W[Out, In].T`` when ``transposed``
    (the tied LM head, quantized along its last axis) -> ``[T, ...Out]``."""
    from pagedjax.kernels_pallas import live_rows, packed
    from pagedjax.kernels_pallas.cpu import blockmatmul as cpu_blockmatmul

    # Components packed in one buffer of weights (the runner's): read there in place.
    inplace = packed.sources(comps)
    # A padded step's padding rows: left out (their outputs zero).
    live = live_rows.lookup(x.shape[0])
    if transposed:
        return cpu_blockmatmul.blockmatmul(kind, comps, x, transposed=True, packed=inplace,
                                           live_rows=live)
    out_shape = comps[next(iter(comps))].shape[1:]
    flat = {k: v.reshape(v.shape[0], -1) for k, v in comps.items()}
    y = cpu_blockmatmul.blockmatmul(kind, flat, x, packed=inplace, live_rows=live)
    return y.reshape(x.shape[0], *out_shape)


def matmul(x: jax.Array, w: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN, *,
           transposed: bool = False) -> jax.Array:
    """``x [T, In] @ w [In, ...Out]`` -> ``[T, ...Out]``, or ``x @ w[Out, In].T``
    when ``transposed``."""
    if _native(x, w, plan):
        from pagedjax.kernels_pallas.cpu import native as cpu_native

        w2 = w if transposed else w.reshape(w.shape[0], -1)
        y = cpu_native.matmul(x, w2, transposed=transposed)
        return y if transposed else y.reshape(x.shape[0], *w.shape[1:])
    if transposed:
        return jnp.einsum("ti,oi->to", x, w)
    return jnp.tensordot(x, w, axes=1)


# ----------------------------------------------------------------------------- attention


def attention_kernel(plan: ExecutionPlan) -> Callable:
    """The ragged paged-attention callable a plan asks for: ``plan.attention_fn``
    when set, else ``kernels_pallas.ragged_paged_attention`` (run per device
    through ``shard_map`` over KV heads under tensor parallelism for the custom
    kernels; GSPMD partitions the ``xla`` backend by itself)."""
    if plan.attention_fn is not None:
        return plan.attention_fn
    sharded = getattr(kernels_pallas, "sharded_attention", None)
    if plan.mesh is not None and plan.attn_backend != "xla" and sharded is not None:
        return sharded(plan.mesh, plan.tp_axis)
    return kernels_pallas.ragged_paged_attention
