"""Zero-filled arrays on the CPU that cost no writes: the KV page pool.

``zeros(specs)`` returns one zero-filled array per ``(shape, dtype)``, made by
a jitted program of C++ FFI calls (zero_pages.cc) that hand each output back
zeroed as calloc does (the whole pages returned to the kernel, read as zeros
and paid for only when first written), where ``jnp.zeros`` writes every byte:
about 0.8 CPU seconds for the default 2 GiB pool at every start. The arrays
are XLA's own buffers, so a step can donate them (an imported zero mapping
would be copied by the first donated step). Built like the other kernels
(kernels_pallas/cpu/build.py); ``available()`` is False without a compiler or
with ``PAGEDJAX_CPU_NATIVE=0``, and callers then use ``jnp.zeros``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from pagedjax.kernels_pallas.cpu.build import FfiLibrary

TARGET = "pagedjax_zero_pages"
SOURCE = Path(__file__).with_name("zero_pages.cc")

_LIB = FfiLibrary(SOURCE, "cpu_zero_pages", {TARGET: "PagedjaxZeroPages"})


def load_in_background():
    """Build (or find in the cache) and register the handler on a daemon thread."""
    return _LIB.load_in_background()


def available() -> bool:
    """True on the CPU platform when the handler is built and registered."""
    return jax.default_backend() == "cpu" and _LIB.load() is not None


@functools.partial(jax.jit, static_argnames=("specs",))
def _zeros(specs):
    # has_side_effect: XLA must not merge the identical argument-less calls into
    # one buffer (it would then copy it into every output).
    return tuple(jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(shape, dtype),
                                  has_side_effect=True)() for shape, dtype in specs)


def zeros(specs) -> tuple[jax.Array, ...]:
    """One zero-filled array per ``(shape, dtype)`` of ``specs``."""
    specs = tuple((tuple(int(n) for n in shape), jnp.dtype(dtype).name) for shape, dtype in specs)
    if not available():
        return tuple(jnp.zeros(shape, dtype) for shape, dtype in specs)
    return _zeros(specs)
