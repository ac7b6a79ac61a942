"""The few-row matmul with int8 weights as C++ on the CPU (XLA FFI).

``qmatmul(x, q, scale)`` is ``(x [M, K] @ q [K, N]) * scale [N]`` (``transposed``:
``x @ q[N, K].T * scale``, the tied LM head), x and scale float32, q int8:
models/quant.py's per-channel symmetric "int8" weights, kept int8 in memory.
Each weight element is read once per call as one byte and widened to f32 a
small block at a time (AVX-512 / AVX2 / a portable loop, see qmatmul.cc),
so a decode step of few rows reads a quarter of float32's bytes. The models
use it where the execution plan runs float32 matmuls in the C++ kernel
(``plan.native_matmul_rows``, models/nn.py).

Built like the other kernels (kernels_pallas/cpu/build.py: system compiler,
-march=native, then AVX2 + FMA, then portable, each build self-tested in a
child process, cached under ``$PAGEDJAX_CACHE_DIR``); ``available()`` is False
without a compiler or with ``PAGEDJAX_CPU_NATIVE=0``, and ``qmatmul`` then runs
the same product in ``jnp``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.kernels_pallas.cpu.build import FfiLibrary

TARGET = "pagedjax_qmatmul"
SOURCE = Path(__file__).with_name("qmatmul.cc")

_LIB = FfiLibrary(SOURCE, "cpu_qmatmul", {TARGET: "PagedjaxQMatmul"})
_load = _LIB.load


def available() -> bool:
    """True when the kernel is built (or was built now) and registered with XLA."""
    return _load() is not None


def fast() -> bool:
    """True when the built kernel has its vectorized (AVX2 + FMA) paths."""
    lib = _load()
    return lib is not None and bool(lib.PagedjaxFastQMatmul())


def unavailable_reason() -> str | None:
    _load()
    return _LIB.error


def reference(x: jax.Array, q: jax.Array, scale: jax.Array, *,
              transposed: bool = False) -> jax.Array:
    """The same product in ``jnp`` (q widened to x's dtype, the scale after the dot)."""
    w = q.astype(x.dtype)
    return (x @ (w.T if transposed else w)) * scale.astype(x.dtype)


def qmatmul(x: jax.Array, q: jax.Array, scale: jax.Array, *,
            transposed: bool = False) -> jax.Array:
    """``(x [M, K] @ q [K, N]) * scale [N]`` (``transposed``: q is [N, K]) -> f32 [M, N].

    x float32 [M, K], q int8, scale float32 [N]; other dtypes, or no built
    kernel, run :func:`reference`. Shapes that do not match raise ValueError."""
    if x.ndim != 2 or q.ndim != 2 or scale.ndim != 1:
        raise ValueError(f"qmatmul: expected x [M, K], q 2-d and scale [N], got x {x.shape}, "
                         f"q {q.shape}, scale {scale.shape}")
    k, n = (q.shape[1], q.shape[0]) if transposed else q.shape
    if x.shape[1] != k or scale.shape[0] != n:
        raise ValueError(f"qmatmul: x {x.shape}, q {q.shape} (transposed={transposed}) and "
                         f"scale {scale.shape} do not match")
    f32 = jnp.dtype(jnp.float32)
    if (x.dtype != f32 or q.dtype != jnp.dtype(jnp.int8) or scale.dtype != f32
            or not available()):
        return reference(x, q, scale, transposed=transposed)
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x.shape[0], n), f32),
                            vmap_method="sequential")
    return call(x, q, scale, transposed=np.int32(transposed))
