"""Grouped matmul of a mixture-of-experts layer: rows sorted by expert, each group of rows
multiplied by its own expert's weight, never by the others'.

    y = grouped_matmul(x, w, group_sizes, impl="auto")
    # x [M, K] rows sorted by group; w [G, K, N]; group_sizes i32[G] (sum <= M)
    # y [M, N]: rows of group g are x[rows] @ w[g]; rows past sum(group_sizes) are 0

Three implementations, one contract, all with static shapes (M, G, K, N fix the
compiled program; the group sizes are data):

``ragged``   ``jax.lax.ragged_dot``. On TPU it lowers to a grouped kernel; on CPU
             (and GPU) XLA expands it to a masked product with every group's
             weight, G times the work (BENCHMARKS.md), so ``auto`` uses it on TPU only.
``gather``   each row multiplied by its own group's weight, indexed in place, one row
             at a time: reads M weight matrices, the floor for the few rows of a
             decode step.
``blocked``  the rows regrouped into blocks of ``block`` rows that each belong to one
             group (every group padded to a whole number of blocks), then one
             ``[block, K] @ [K, N]`` product per block in a loop that indexes the
             weight in place: at most ceil(M / block) + min(G, M) blocks, each
             weight read once per block of its rows.

``pallas``   the ``blocked`` layout with one Pallas program per block and weight tile
             (``kernels_pallas/pallas/grouped_matmul.py``: Triton on GPU, Mosaic on
             TPU, each compile-checked at real expert shapes; interpret mode on CPU).

``auto``: ``ragged`` on TPU, else ``gather`` up to ``gather_rows`` rows, else ``blocked``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

IMPLS = ("auto", "ragged", "gather", "blocked", "pallas")
GATHER_ROWS = 16
BLOCK = 16


def choose_impl(m: int, impl: str = "auto", gather_rows: int = GATHER_ROWS) -> str:
    if impl not in IMPLS:
        raise ValueError(f"grouped_matmul: impl {impl!r} is not one of {IMPLS}")
    if impl != "auto":
        return impl
    if jax.default_backend() == "tpu":
        return "ragged"
    return "gather" if m <= gather_rows else "blocked"


def group_ids(group_sizes: jax.Array, m: int) -> jax.Array:
    """i32[m]: the group of each sorted row; rows past the groups get G (none)."""
    ends = jnp.cumsum(group_sizes)
    return jnp.searchsorted(ends, jnp.arange(m, dtype=ends.dtype), side="right").astype(jnp.int32)


def grouped_matmul(
    x: jax.Array,  # [M, K] rows sorted by group
    w: jax.Array,  # [G, K, N]
    group_sizes: jax.Array,  # i32[G]
    impl: str = "auto",
    *,
    block: int = BLOCK,
    gather_rows: int = GATHER_ROWS,
) -> jax.Array:  # [M, N]
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_matmul: x {x.shape} and w {w.shape} do not match "
                         "([M, K] and [G, K, N])")
    impl = choose_impl(x.shape[0], impl, gather_rows)
    if impl == "ragged":
        return jax.lax.ragged_dot(x, w, group_sizes.astype(jnp.int32))
    if impl == "gather":
        return _gather(x, w, group_sizes)
    if impl == "pallas":
        return _pallas(x, w, group_sizes, block, interpret=jax.default_backend() == "cpu")
    return _blocked(x, w, group_sizes, block)


def _gather(x, w, group_sizes):
    g = w.shape[0]
    gid = group_ids(group_sizes, x.shape[0])

    def one(args):  # one row times its group's weight, indexed in place (no weight copy)
        xr, gi = args
        return jnp.dot(xr[None], jax.lax.dynamic_index_in_dim(w, gi, axis=0, keepdims=False))[0]

    y = jax.lax.map(one, (x, jnp.minimum(gid, g - 1)))
    return jnp.where((gid < g)[:, None], y, 0).astype(x.dtype)


def block_layout(x, group_sizes, num_groups: int, block: int):
    """The rows regrouped into blocks of one group each (every group padded to whole
    blocks): (xp [nb*block, K], dest i32[M] row of each x row in xp (nb*block: none),
    gid i32[M] group of each row (G: none), block_group i32[nb])."""
    m, k = x.shape
    g = num_groups
    nb = -(-m // block) + min(g, m)
    sizes = group_sizes.astype(jnp.int32)
    padded = (sizes + block - 1) // block * block
    start = jnp.cumsum(sizes) - sizes
    pstart = jnp.cumsum(padded) - padded
    gid = group_ids(sizes, m)
    gc = jnp.minimum(gid, g - 1)
    rows = jnp.arange(m, dtype=jnp.int32)
    dest = jnp.where(gid < g, pstart[gc] + rows - start[gc], nb * block)  # past the end: dropped
    xp = jnp.zeros((nb * block, k), x.dtype).at[dest].set(x, mode="drop")
    block_group = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(nb, dtype=jnp.int32) * block,
                                   side="right")
    return xp, dest, gid, jnp.minimum(block_group, g - 1).astype(jnp.int32)


def unblock(yp, dest, gid, num_groups: int, dtype):
    """[nb*block, N] block products -> [M, N] in the sorted row order (0 past the groups)."""
    y = jnp.take(yp, jnp.minimum(dest, yp.shape[0] - 1), axis=0)
    return jnp.where((gid < num_groups)[:, None], y, 0).astype(dtype)


def _blocked(x, w, group_sizes, block):
    g, k, n = w.shape
    xp, dest, gid, block_group = block_layout(x, group_sizes, g, block)
    nb = block_group.shape[0]

    def one(args):
        xb, gi = args
        return jnp.dot(xb, jax.lax.dynamic_index_in_dim(w, gi, axis=0, keepdims=False))

    yb = jax.lax.map(one, (xp.reshape(nb, block, k), block_group))  # [nb, block, N]
    return unblock(yb.reshape(nb * block, n), dest, gid, g, x.dtype)


def _pallas(x, w, group_sizes, block, interpret):
    from pagedjax.kernels_pallas.pallas.grouped_matmul import block_matmul

    g = w.shape[0]
    xp, dest, gid, block_group = block_layout(x, group_sizes, g, block)
    yp = block_matmul(xp, w, block_group, block=block, interpret=interpret)
    return unblock(yp, dest, gid, g, x.dtype)


def dense_all_experts(x, w, group_sizes):
    """The product a dense formulation computes: every row by every group's weight, then
    each row's own group selected ([M, G, N] of work; for benchmarks and tests)."""
    g = w.shape[0]
    gid = group_ids(group_sizes, x.shape[0])
    y = jnp.einsum("mk,gkn->mgn", x, w)
    sel = jax.nn.one_hot(gid, g, dtype=x.dtype)
    return jnp.einsum("mgn,mg->mn", y, sel)
