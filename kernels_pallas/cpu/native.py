"""C++ kernels for the CPU, called through XLA's FFI: ragged paged attention and
the few-row float32 matmuls of decode steps.

The sources (``attention.cc``, ``matmul.cc``: a library each) are built,
self-tested, cached and registered by ``kernels_pallas/cpu/build.py``. Without a
compiler ``available()`` is False and ``attention_backend="auto"`` keeps the
XLA (pure jnp) path; set ``PAGEDJAX_CPU_NATIVE=0`` to force that.

``ragged_paged_attention``: same contract and results as
``reference.ragged_paged_attention``; q in float32 or bfloat16, pages in
float32, bfloat16, float16, int8 or float8_e4m3fn (with scales), head_dim a multiple of
8. Other cases run the reference. ``matmul``: float32 ``x @ w`` (or
``x @ w.T``); the models use it for steps of few tokens (models/layers.py).
The quantized-weight variants are ``qmatmul.py`` (int8 per channel) and
``blockmatmul.py`` (GGUF blocks), libraries of their own.
"""

from __future__ import annotations

import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.kernels_pallas import reference
from pagedjax.kernels_pallas.cpu.build import FfiLibrary

TARGET = "pagedjax_ragged_paged_attention"
MATMUL_TARGET = "pagedjax_matmul"
SOURCE = Path(__file__).with_name("attention.cc")
MATMUL_SOURCE = Path(__file__).with_name("matmul.cc")
_Q_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_KV_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16),
              jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))

_KERNELS = FfiLibrary(SOURCE, "cpu_kernels", {TARGET: "PagedjaxRaggedPagedAttention"})
_MATMUL = FfiLibrary(MATMUL_SOURCE, "cpu_matmul", {MATMUL_TARGET: "PagedjaxMatmul"})
_load = _KERNELS.load


def load_in_background() -> list[threading.Thread]:
    """Build (or find in the cache) and register the attention kernel and the matmul
    on daemon threads."""
    return [_KERNELS.load_in_background(), _MATMUL.load_in_background()]


def available() -> bool:
    """True when the attention kernel is built (or was built now) and registered."""
    return _load() is not None


def fast_matmul() -> bool:
    """True when the matmul is built and has its vectorized (AVX2 + FMA) paths."""
    lib = _MATMUL.load()
    return lib is not None and bool(lib.PagedjaxFastMatmul())


def unavailable_reason() -> str | None:
    """Why the attention kernel is unavailable (None when it loaded)."""
    _load()
    return _KERNELS.error


def matmul_unavailable_reason() -> str | None:
    """Why the C++ matmul is unavailable (None when it loaded). It is a library of
    its own, so it can fail while the attention kernel loads; ``matmul`` then runs
    ``jnp``."""
    _MATMUL.load()
    return _MATMUL.error


def supports(q_dtype, kv_dtype, head_dim: int) -> bool:
    return (jnp.dtype(q_dtype) in _Q_DTYPES and jnp.dtype(kv_dtype) in _KV_DTYPES
            and head_dim % 8 == 0)


def ragged_paged_attention(
    q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, sm_scale: float,
    sliding_window: int | None = None, soft_cap: float | None = None, kv_scales=None,
    max_q_len: int | None = None,
):
    """See ``reference.py`` for the contract."""
    reference.check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window: expected a positive int or None, got {sliding_window}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap: expected a positive float or None, got {soft_cap}")
    if kv_scales is not None and jnp.dtype(kv_scales.dtype) != jnp.dtype(jnp.float32):
        raise ValueError(f"kv_scales: expected float32, got {kv_scales.dtype}")
    if not supports(q.dtype, kv_pages.dtype, q.shape[-1]):
        return reference.ragged_paged_attention(
            q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=sm_scale,
            sliding_window=sliding_window, soft_cap=soft_cap, kv_scales=kv_scales,
            max_q_len=max_q_len)
    if not available():
        raise RuntimeError(f"attention_backend='cpu_native' is unavailable: "
                           f"{unavailable_reason()}; use attention_backend='xla'")
    i32 = jnp.int32
    scales = kv_scales if kv_scales is not None else jnp.zeros((1,), jnp.float32)
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype),
                            vmap_method="sequential")
    return call(q, kv_pages, scales, kv_lens.astype(i32),
                page_table.astype(i32), cu_q_lens.astype(i32),
                jnp.reshape(num_seqs, (1,)).astype(i32),
                sm_scale=np.float32(sm_scale), sliding_window=np.int32(sliding_window or 0),
                soft_cap=np.float32(soft_cap or 0.0), has_scales=np.int32(kv_scales is not None))


def matmul(x: jax.Array, w: jax.Array, *, transposed: bool = False) -> jax.Array:
    """``x [M, K] @ w [K, N]`` (``transposed``: ``x @ w[N, K].T``), float32.

    For the few-row matmuls of decode steps (see matmul.cc); other dtypes
    and ranks go to ``jnp``.
    """
    f32 = jnp.dtype(jnp.float32)
    if x.ndim != 2 or w.ndim != 2 or x.dtype != f32 or w.dtype != f32 or \
            _MATMUL.load() is None:
        return x @ (w.T if transposed else w)
    k = w.shape[1] if transposed else w.shape[0]
    if x.shape[1] != k:
        raise ValueError(f"matmul: x {x.shape} and w {w.shape} (transposed={transposed}) "
                         "do not match")
    n = w.shape[0] if transposed else w.shape[1]
    call = jax.ffi.ffi_call(MATMUL_TARGET, jax.ShapeDtypeStruct((x.shape[0], n), f32),
                            vmap_method="sequential")
    return call(x, w, transposed=np.int32(transposed))
