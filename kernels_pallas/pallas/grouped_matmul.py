"""The grouped matmul's block products as a Pallas kernel (Triton on GPU, Mosaic on TPU;
interpret mode on CPU).

    yp = block_matmul(xp, w, block_group, block=16)
    # xp [nb*block, K]: rows regrouped so that block b belongs to group block_group[b]
    #                   (kernels_pallas/grouped_matmul.py block_layout)
    # w  [G, K, N];  yp [nb*block, N]: block b is xp[b] @ w[block_group[b]]

Grid ``(nb, N / bn)``: program (b, j) multiplies its ``[block, K]`` rows by the
``[K, bn]`` tile j of its group's weight, and reads no other weight. The group index
is data (``block_group``), so the weight tile's place is known only at run time:

``triton``  (GPU, and the interpreter on CPU) every ref is whole in global memory;
            the program reads its group id as a scalar and loops over K in ``bk``
            steps, loading a ``[block, bk]`` slice of its rows and a ``[bk, bn]``
            tile of its group's weight per step into an f32 ``[block, bn]``
            accumulator.
``mosaic``  (TPU) ``block_group`` is a scalar-prefetch operand: the weight's
            BlockSpec index map reads it, so the pipeline DMAs the ``[K, bn]`` tile
            of the right expert into VMEM (double-buffered, the next one while this
            one multiplies) beside the ``[block, K]`` rows; one MXU product per program.

Tiles. ``bn`` = 128 (the MXU's and a Triton dot's natural width) and ``bk`` = 64
(Triton) when they divide N and K, else the largest power of two that does. On
sm_90a and sm_80 the Triton program then holds a ``16 x 128`` f32 accumulator and
one ``16 x 64`` + ``64 x 128`` bf16 tile pair per pipeline stage, on 4 warps: far from
any register, shared-memory or occupancy limit (BENCHMARKS.md lists each expert
shape). On TPU a program holds two ``[K, 128]`` weight tiles (7 MiB at Mixtral's
K = 14,336) and two ``[16, K]`` row blocks, under 80% of the 32 MiB it asks for.
Checked by kernels_pallas/pallas/grouped_matmul_variants.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

BLOCK_N = 128
BLOCK_K = 64
VMEM_LIMIT = 32 << 20  # asked of Mosaic; v5e / v6e cores have 128 MiB
NUM_WARPS = 4
NUM_STAGES = 2


def _pow2_tile(n: int, want: int) -> int:
    """The largest power of two that divides ``n`` and is at most ``want``."""
    t = 1
    while t * 2 <= want and n % (t * 2) == 0:
        t *= 2
    return t


def plan(k: int, n: int, bn: int | None = None, bk: int | None = None) -> tuple[int, int]:
    """(bn, bk): the weight tile's width and the K step (module docstring)."""
    bn = _pow2_tile(n, BLOCK_N) if bn is None else bn
    bk = _pow2_tile(k, BLOCK_K) if bk is None else bk
    for name, t, dim in (("bn", bn, n), ("bk", bk, k)):
        if t < 1 or dim % t:
            raise ValueError(f"block_matmul: {name}={t} must divide {dim}")
    return bn, bk


def _backend(backend: str | None) -> str:
    if backend is None:
        return "mosaic" if jax.default_backend() == "tpu" else "triton"
    if backend not in ("triton", "mosaic"):
        raise ValueError(f"block_matmul: backend must be 'triton' or 'mosaic', got {backend!r}")
    return backend


def block_matmul(xp: jax.Array, w: jax.Array, block_group: jax.Array, *, block: int,
                 interpret: bool = False, backend: str | None = None, bn: int | None = None,
                 bk: int | None = None, num_warps: int = NUM_WARPS,
                 num_stages: int = NUM_STAGES, vmem_limit_bytes: int = VMEM_LIMIT) -> jax.Array:
    rows, k = xp.shape
    g, kw, n = w.shape
    nb = block_group.shape[0]
    if kw != k:
        raise ValueError(f"block_matmul: xp has K={k}, w has K={kw}")
    if rows != nb * block:
        raise ValueError(f"block_matmul: xp has {rows} rows, want {nb} blocks of {block}")
    bn, bk = plan(k, n, bn, bk)
    backend = _backend(backend)
    if backend == "triton" and not interpret and min(block, bn, bk) < 16:
        raise ValueError(f"block_matmul: a Triton dot needs block, bn and bk >= 16, got "
                         f"block={block}, bn={bn}, bk={bk}")
    return _call(xp, w, block_group.astype(jnp.int32), block=block, bn=bn, bk=bk,
                 backend=backend, interpret=bool(interpret), num_warps=num_warps,
                 num_stages=num_stages, vmem_limit_bytes=vmem_limit_bytes)


@functools.partial(jax.jit, static_argnames=(
    "block", "bn", "bk", "backend", "interpret", "num_warps", "num_stages",
    "vmem_limit_bytes"))
def _call(xp, w, block_group, *, block, bn, bk, backend, interpret, num_warps, num_stages,
          vmem_limit_bytes):
    if backend == "mosaic":
        return _mosaic(xp, w, block_group, block=block, bn=bn, interpret=interpret,
                       vmem_limit_bytes=vmem_limit_bytes)
    return _triton(xp, w, block_group, block=block, bn=bn, bk=bk, interpret=interpret,
                   num_warps=num_warps, num_stages=num_stages)


def _triton(xp, w, block_group, *, block, bn, bk, interpret, num_warps, num_stages):
    from jax.experimental.pallas import triton as plgpu

    rows, k = xp.shape
    n = w.shape[2]
    precision = lax.Precision.HIGHEST if xp.dtype == jnp.float32 else None

    def kernel(bg_ref, x_ref, w_ref, o_ref):
        b, j = pl.program_id(0), pl.program_id(1)
        gi = bg_ref[b]

        def step(kk, acc):
            x = x_ref[pl.ds(b * block, block), pl.ds(kk * bk, bk)]
            wt = w_ref[gi, pl.ds(kk * bk, bk), pl.ds(j * bn, bn)]
            return acc + jnp.dot(x, wt, preferred_element_type=jnp.float32,
                                 precision=precision)

        acc = lax.fori_loop(0, k // bk, step, jnp.zeros((block, bn), jnp.float32))
        o_ref[pl.ds(b * block, block), pl.ds(j * bn, bn)] = acc.astype(o_ref.dtype)

    params = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")
    return pl.pallas_call(
        kernel,
        grid=(block_group.shape[0], n // bn),
        out_shape=jax.ShapeDtypeStruct((rows, n), xp.dtype),
        interpret=interpret,
        compiler_params=params(num_warps=num_warps, num_stages=num_stages),
        name=f"grouped_block_matmul_b{block}_n{bn}_k{bk}",
    )(block_group, xp, w)


def _mosaic(xp, w, block_group, *, block, bn, interpret, vmem_limit_bytes):
    from jax.experimental.pallas import tpu as pltpu

    rows, k = xp.shape
    n = w.shape[2]

    def kernel(bg_ref, x_ref, w_ref, o_ref):
        del bg_ref  # read by the index maps
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...],
                             preferred_element_type=jnp.float32).astype(o_ref.dtype)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(block_group.shape[0], n // bn),
        in_specs=[pl.BlockSpec((block, k), lambda b, j, bg: (b, 0)),
                  pl.BlockSpec((None, k, bn), lambda b, j, bg: (bg[b], 0, j))],
        out_specs=pl.BlockSpec((block, bn), lambda b, j, bg: (b, j)))
    params = getattr(pltpu, "CompilerParams", None) or getattr(pltpu, "TPUCompilerParams")
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((rows, n), xp.dtype),
        interpret=interpret,
        compiler_params=params(dimension_semantics=("parallel", "parallel"),
                               vmem_limit_bytes=vmem_limit_bytes),
        name=f"grouped_block_matmul_b{block}_n{bn}",
    )(block_group, xp, w)
