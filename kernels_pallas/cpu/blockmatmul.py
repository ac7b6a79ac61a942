"""The matmul with GGUF block-quantized weights as C++ on the CPU (XLA FFI).

``blockmatmul(kind, comps, x)`` is ``x [M, K] @ W [K, N]`` where ``W`` is the
weight whose models/quant.py components ``comps`` (kind ``q8_0``, ``q4_0``,
``q4_1``, ``q4_k``, ``q6_k`` or ``int4_g<G>``, AWQ / GPTQ groups of G rows;
quantized along K: every component ``[K_c, N]``)
describe; ``transposed=True`` is ``x @ W[N, K].T`` for a table quantized along
its last axis (the tied LM head, components ``[N, K_c]``). The blocks stay in
memory as the GGUF file has them and are widened to float32 in registers
(blockmatmul.cc, blocks.h), summed in float32 (a few rows of x factor the
blocks' scales out of their sums): the product of the dequantized weight up to
float32 rounding, as another summation order would give, reading 4-7x fewer
bytes than the float32 weight. The models use it on the CPU for the steps the
execution plan routes to it (``plan.block_matmul_rows``, models/nn.py).

Built like the other kernels (kernels_pallas/cpu/build.py: system compiler,
-march=native, then AVX2 + FMA, then portable, each build self-tested in a
child process, cached under ``$PAGEDJAX_CACHE_DIR``); without a compiler or
with ``PAGEDJAX_CPU_NATIVE=0``, ``available()`` is False and the models keep
the ``jnp`` dequantizing path.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.kernels_pallas.cpu.build import FfiLibrary

TARGET = "pagedjax_blockmatmul"
SOURCE = Path(__file__).with_name("blockmatmul.cc")
# kind -> (its number in blocks.h, its components in order, the quantized block)
KINDS: dict[str, tuple[int, tuple[str, ...], int]] = {
    "q8_0": (0, ("q", "d"), 32),
    "q4_0": (1, ("qs", "d"), 32),
    "q4_1": (2, ("qs", "d", "m"), 32),
    "q4_k": (3, ("qs", "sc", "mn", "d", "dmin"), 256),
    "q6_k": (4, ("ql", "qh", "sc", "d"), 256),
    "int4": (5, ("qs", "s", "z"), 32),
}
# kind -> each component's divisor of the quantized axis (models/quant.py's FORMATS)
DIVISORS = {"q8_0": (1, 32), "q4_0": (2, 32), "q4_1": (2, 32, 32),
            "q4_k": (2, 32, 32, 256, 256), "q6_k": (2, 4, 16, 256), "int4": (2, 0, 0)}


def split_kind(kind: str) -> tuple[str, int]:
    """``int4_g128`` -> ("int4", 128) (AWQ / GPTQ groups of 128 rows: s f32 and
    z u8 per group, w = s * (nibble - z)); a GGUF kind -> (kind, 0)."""
    if kind.startswith("int4_g") and kind[6:].isdigit() and int(kind[6:]) % 32 == 0 \
            and int(kind[6:]) > 0:
        return "int4", int(kind[6:])
    if kind not in KINDS or kind == "int4":
        raise ValueError(f"blockmatmul: kind {kind!r} is not one of "
                         f"{sorted(set(KINDS) - {'int4'})} or int4_g<G> (G a multiple of 32)")
    return kind, 0

_LIB = FfiLibrary(SOURCE, "cpu_blockmatmul", {TARGET: "PagedjaxBlockMatmul"})
_load = _LIB.load


def load_in_background():
    """Build (or find in the cache) and register the kernel on a daemon thread."""
    return _LIB.load_in_background()


def available() -> bool:
    """True when the kernel is built (or was built now) and registered with XLA."""
    return _load() is not None


def fast() -> bool:
    """True when the built kernel has its vectorized (AVX2 + FMA) register tiles."""
    lib = _load()
    return lib is not None and bool(lib.PagedjaxFastBlockMatmul())


def unavailable_reason() -> str | None:
    _load()
    return _LIB.error


def library_path() -> str | None:
    """The built shared library (None when unavailable): its row limit's cache key."""
    from pagedjax.kernels_pallas.cpu import build as cpu_build

    info = cpu_build.build_info("cpu_blockmatmul") if available() else None
    return info["so"] if info else None


def component_shapes(kind: str, k: int, n: int, transposed: bool) -> dict[str, tuple]:
    """The shape of each component of a [K, N] weight (``transposed``: [N, K])."""
    base, group = split_kind(kind)
    _, names, block = KINDS[base]
    block = max(block, group)
    if k % block:
        raise ValueError(f"blockmatmul: K={k} is not a multiple of {kind}'s block of {block}")
    divs = [d or group for d in DIVISORS[base]]
    return {c: (n, k // d) if transposed else (k // d, n) for c, d in zip(names, divs)}


def _check(kind: str, comps: dict, x: jax.Array, transposed: bool) -> tuple[int, int]:
    names = KINDS[split_kind(kind)[0]][1]
    if set(comps) != set(names):
        raise ValueError(f"blockmatmul: {kind} takes components {names}, got {sorted(comps)}")
    if x.ndim != 2 or x.dtype != jnp.dtype(jnp.float32):
        raise ValueError(f"blockmatmul: expected x float32 [M, K], got {x.dtype} {x.shape}")
    first = comps[names[0]]
    if first.ndim != 2:
        raise ValueError(f"blockmatmul: expected 2-d components, got {names[0]} {first.shape}")
    k, n = x.shape[1], first.shape[0] if transposed else first.shape[1]
    for name, shape in component_shapes(kind, k, n, transposed).items():
        if tuple(comps[name].shape) != shape:
            raise ValueError(f"blockmatmul: x {x.shape} needs {kind} component {name} of "
                             f"shape {shape} (transposed={transposed}), got "
                             f"{comps[name].shape}")
    return k, n


def build_target(flags: list[str]) -> str:
    """The kernel built with exactly these compiler flags (one of
    ``build.default_flag_sets()``: this CPU's set, AVX2 + FMA, portable; cached and
    self-tested like the default build), registered with XLA under a target of its
    own: for ``blockmatmul(..., target=)`` (tests and benchmarks of each build path).
    Raises RuntimeError when that build cannot run on this machine."""
    import ctypes

    from pagedjax.kernels_pallas.cpu import build as cpu_build

    target = f"{TARGET}_{'_'.join(f.strip('-').replace('=', '_') for f in flags)}"
    if target not in _PATH_TARGETS:
        so = cpu_build.build(source=SOURCE, name="cpu_blockmatmul", flag_sets=[flags])
        lib = ctypes.CDLL(str(so))
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.PagedjaxBlockMatmul),
                                    platform="cpu")
        _PATH_TARGETS[target] = lib
    return target


_PATH_TARGETS: dict[str, object] = {}


def blockmatmul(kind: str, comps: dict, x: jax.Array, *, transposed: bool = False,
                target: str | None = None,
                packed: tuple[jax.Array, dict[str, int]] | None = None,
                live_rows: jax.Array | int | None = None) -> jax.Array:
    """``x [M, K] @ W [K, N]`` (``transposed``: ``x @ W[N, K].T``) -> f32 [M, N], W given
    by its models/quant.py components. x must be float32; shapes or dtypes that do not
    fit raise ValueError, and RuntimeError says why when the kernel is not built.
    ``target``: another build's (:func:`build_target`). ``packed``: (buffer, each
    component's byte offset in it) when the components are views of one buffer of
    packed weights (kernels_pallas/packed.py ``sources``): the kernel then reads that
    buffer in place. ``live_rows``: how many leading rows of x are real (an i32 scalar,
    kernels_pallas/live_rows.py); the kernel leaves the rest out and returns zeros
    there (None, or a count outside [0, M]: every row)."""
    k, n = _check(kind, comps, x, transposed)
    if target is None and not available():
        raise RuntimeError(f"the C++ block matmul is unavailable: {unavailable_reason()}")
    base, group = split_kind(kind)
    code, names, _ = KINDS[base]
    if packed is None:
        args, offsets = [comps[c] for c in names], [-1] * len(names)
    else:
        buffer, at = packed
        if buffer.ndim != 1 or buffer.dtype != jnp.dtype(jnp.uint8):
            raise ValueError(f"blockmatmul: a packed buffer is u8[size], got {buffer.dtype} "
                             f"{buffer.shape}")
        args, offsets = [buffer] * len(names), [int(at[c]) for c in names]
    pad = 5 - len(names)
    args += [jnp.zeros((1,), jnp.uint8)] * pad
    call = jax.ffi.ffi_call(target or TARGET, jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32),
                            vmap_method="sequential")
    live = jnp.full((1,), -1, jnp.int32) if live_rows is None else \
        jnp.asarray(live_rows, jnp.int32).reshape(1)
    return call(x, *args, live, kind=np.int32(code), transposed=np.int32(transposed),
                n_out=np.int64(n), group=np.int64(group),
                offsets=np.array(offsets + [-1] * pad, np.int64))
