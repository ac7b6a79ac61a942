"""The sampler's draw as one C++ pass per row on the CPU (XLA FFI).

``sample(x, temperature, greedy, top_k, top_p, min_p, u)`` takes processed
logits f32[R, V] and per-row parameters and returns the token of each row,
following the rules of pagedjax/sample/sampler.py's jnp path (greedy argmax;
temperature, min-p, top-k, then top-p on the renormalised top-k mass; an
inverse-CDF draw with the row's uniform ``u``). It replaces XLA's argmax,
``lax.top_k`` and prefix sums, which cost tens to hundreds of ms per step at
128 rows of a 49,152-token vocabulary (benchmarks/kernel_bench/sampler.py). See
cpu_sampler.cc for the method (a histogram of exp's float bits instead of a
sort).

Built like the kernels (kernels_pallas/cpu/build.py: system compiler, cached
under ``$PAGEDJAX_CACHE_DIR``); ``available()`` is False without a compiler or
with ``PAGEDJAX_CPU_NATIVE=0``, and the sampler then keeps its jnp path.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from pagedjax.kernels_pallas.cpu.build import FfiLibrary

TARGET = "pagedjax_sample"
SOURCE = Path(__file__).with_name("sampler.cc")

_LIB = FfiLibrary(SOURCE, "cpu_sampler", {TARGET: "PagedjaxSample"})
_load = _LIB.load


def load_in_background():
    """Build (or find in the cache) and register the sampler on a daemon thread."""
    return _LIB.load_in_background()


def available() -> bool:
    """True when the sampler is built (or was built now) and registered with XLA."""
    return _load() is not None


def unavailable_reason() -> str | None:
    _load()
    return _LIB.error


def sample(x: jax.Array, temperature: jax.Array, greedy: jax.Array, top_k: jax.Array,
           top_p: jax.Array, min_p: jax.Array, u: jax.Array) -> jax.Array:
    """Tokens i32[R] of processed logits x f32[R, V]; per-row arrays are [R]
    (greedy: bool, top_k >= V or top_p >= 1 or min_p <= 0 turn a filter off)."""
    if x.ndim != 2:
        raise ValueError(f"x: expected logits [rows, vocab], got shape {x.shape}")
    if not available():
        raise RuntimeError(f"the C++ sampler is unavailable: {unavailable_reason()}")
    R = x.shape[0]
    f32, i32 = jnp.float32, jnp.int32
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((R,), i32), vmap_method="sequential")
    return call(x.astype(f32), temperature.astype(f32), greedy.astype(i32), top_k.astype(i32),
                top_p.astype(f32), min_p.astype(f32), u.astype(f32))
