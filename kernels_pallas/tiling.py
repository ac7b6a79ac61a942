"""Query tiles shared by every backend: static-shape, never crossing a sequence.

A ragged batch's query rows (sequence ``s`` owns rows ``cu_q_lens[s]:cu_q_lens[s+1]``)
are cut into tiles of at most ``block_q`` rows. The table has a static
``num_tiles`` entries; entries past the real tiles are marked invalid and have
0 rows. Pure ``jnp``: the XLA path uses it directly, the Pallas kernels to
build their grid's scalar-prefetch tables.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class QueryTiles(NamedTuple):
    """Per tile (all ``i32[num_tiles]`` except ``valid``/``q_lens``)."""

    seq: jax.Array  # sequence the tile belongs to (clipped to [0, S) for invalid tiles)
    row0: jax.Array  # first flat query row (0 for invalid tiles)
    nrows: jax.Array  # rows in the tile (0 for invalid tiles)
    pos0: jax.Array  # context position of the first row
    kv_len: jax.Array  # the sequence's context length
    valid: jax.Array  # bool: a real tile
    q_lens: jax.Array  # i32[S]: new tokens per sequence (0 past num_seqs / not kept)


def tile_table(cu_q_lens, kv_lens, num_seqs, block_q: int, num_tiles: int,
               keep=None) -> QueryTiles:
    """Tile the query rows. ``keep`` (bool[S]) leaves the other sequences untiled."""
    s = kv_lens.shape[0]
    seq_valid = jnp.arange(s) < num_seqs
    if keep is not None:
        seq_valid = seq_valid & keep
    q_lens = jnp.where(seq_valid, cu_q_lens[1:] - cu_q_lens[:-1], 0).astype(jnp.int32)
    tiles_per_seq = (q_lens + block_q - 1) // block_q
    cu_tiles = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(tiles_per_seq)])
    idx = jnp.arange(num_tiles, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_tiles, idx, side="right") - 1, 0, s - 1).astype(jnp.int32)
    valid = idx < cu_tiles[-1]
    local0 = (idx - cu_tiles[seq]) * block_q  # first query index inside the sequence
    row0 = jnp.where(valid, cu_q_lens[seq] + local0, 0)
    nrows = jnp.where(valid, jnp.minimum(block_q, q_lens[seq] - local0), 0)
    kv_len = kv_lens[seq]
    pos0 = kv_len - q_lens[seq] + local0
    i32 = lambda a: a.astype(jnp.int32)  # noqa: E731
    return QueryTiles(seq, i32(row0), i32(nrows), i32(pos0), i32(kv_len), valid, q_lens)
