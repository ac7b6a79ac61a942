"""The grouped matmul's block products as a Pallas kernel (TPU/GPU; interpret mode on CPU).

    yp = block_matmul(xp, w, block_group, block=16)
    # xp [nb*block, K]: rows regrouped so that block b belongs to group block_group[b]
    #                   (kernels_pallas/grouped_matmul.py block_layout)
    # w  [G, K, N];  yp [nb*block, N]: block b is xp[b] @ w[block_group[b]]

Grid ``(nb, N / bn)``: program (b, j) multiplies its ``[block, K]`` rows by the
``[K, bn]`` tile j of its group's weight, reading only that tile. The group index is
data: the kernel reads it from ``block_group`` and slices the weight, which is
handed to every program whole. That suits the interpreter and weights that fit a
program's memory; it is checked in interpret mode only, and ``auto`` never picks it
(TPUs run ``jax.lax.ragged_dot``'s own grouped kernel).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _tile(n: int, want: int = 128) -> int:
    """The largest divisor of n that is at most ``want`` (whole tiles, no masking)."""
    for t in range(min(n, want), 0, -1):
        if n % t == 0:
            return t
    return n


@functools.partial(jax.jit, static_argnames=("block", "interpret"))
def block_matmul(xp: jax.Array, w: jax.Array, block_group: jax.Array, *, block: int,
                 interpret: bool = False) -> jax.Array:
    rows, k = xp.shape
    g, _, n = w.shape
    nb = block_group.shape[0]
    if rows != nb * block:
        raise ValueError(f"block_matmul: xp has {rows} rows, want {nb} blocks of {block}")
    bn = _tile(n)

    def kernel(bg_ref, x_ref, w_ref, o_ref):
        gi = bg_ref[pl.program_id(0)]
        wt = w_ref[gi, :, pl.ds(pl.program_id(1) * bn, bn)]  # [K, bn] of this block's group
        o_ref[...] = jnp.dot(x_ref[...], wt, preferred_element_type=jnp.float32).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        grid=(nb, n // bn),
        in_specs=[pl.BlockSpec((nb,), lambda b, j: (0,)),
                  pl.BlockSpec((block, k), lambda b, j: (b, 0)),
                  pl.BlockSpec((g, k, n), lambda b, j: (0, 0, 0))],
        out_specs=pl.BlockSpec((block, bn), lambda b, j: (b, j)),
        out_shape=jax.ShapeDtypeStruct((rows, n), xp.dtype),
        interpret=interpret,
    )(block_group, xp, w)
