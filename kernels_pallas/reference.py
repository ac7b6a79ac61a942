"""Ragged paged attention in plain jnp: the reference and the CPU backend.

Contract (shared by every backend in this package):

    q           [T, Hq, D]            new tokens of all sequences, flattened
    kv_pages    [N, page_size, 2*Hkv, D]   one layer's pool (see kv_write.py)
    kv_lens     i32[S]                context length incl. the new tokens
    page_table  i32[S, P]             physical page ids, 0-padded
    cu_q_lens   i32[S+1]              prefix sums of new-token counts
    num_seqs    i32[] or i32[1]       number of valid sequences (<= S)
    -> out      [T, Hq, D]            rows past cu_q_lens[num_seqs] are zero

Sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``; its last
``q_len`` tokens are the new ones, so query row ``i`` of sequence ``s`` sits at
position ``kv_lens[s] - q_len + i`` and sees keys ``0..that position``
(causal), or only the last ``sliding_window`` of them.

How this runs fast on a CPU: query rows are cut into tiles of ``q_tile`` rows
that never cross a sequence boundary. Each tile gathers its sequence's pages
once into a dense ``[C, Hkv, D]`` block and does two batched matmuls. With
``max_q_len == 1`` (a pure decode step) a tile is one row, so the step is one
batched matmul over sequences with no wasted rows. The number of tiles is
static: ``ceil(T / q_tile) + S`` bounds it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kernels_pallas.kv_write import dequantize

_NEG_INF = -1e30


def check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales=None) -> None:
    """Shared argument validation; raises ValueError naming the argument."""
    if q.ndim != 3:
        raise ValueError(f"q: expected [T, num_q_heads, head_dim], got shape {q.shape}")
    if kv_pages.ndim != 4:
        raise ValueError(
            f"kv_pages: expected [num_pages, page_size, 2*num_kv_heads, head_dim], got {kv_pages.shape}"
        )
    t, hq, d = q.shape
    _, _, two_h, dk = kv_pages.shape
    if dk != d:
        raise ValueError(f"kv_pages: head_dim {dk} does not match q head_dim {d}")
    if two_h % 2:
        raise ValueError(f"kv_pages: axis 2 must be 2*num_kv_heads (even), got {two_h}")
    hkv = two_h // 2
    if hq % hkv:
        raise ValueError(
            f"q: num_q_heads {hq} is not divisible by num_kv_heads {hkv} (from kv_pages)"
        )
    if kv_lens.ndim != 1:
        raise ValueError(f"kv_lens: expected i32[S], got shape {kv_lens.shape}")
    s = kv_lens.shape[0]
    if page_table.ndim != 2 or page_table.shape[0] != s:
        raise ValueError(f"page_table: expected i32[{s}, P], got shape {page_table.shape}")
    if cu_q_lens.shape != (s + 1,):
        raise ValueError(f"cu_q_lens: expected i32[{s + 1}], got shape {cu_q_lens.shape}")
    for name, a in (("kv_lens", kv_lens), ("page_table", page_table), ("cu_q_lens", cu_q_lens)):
        if not jnp.issubdtype(a.dtype, jnp.integer):
            raise ValueError(f"{name}: expected an integer array, got dtype {a.dtype}")
    if kv_scales is not None and kv_scales.shape != kv_pages.shape[:3]:
        raise ValueError(
            f"kv_scales: expected shape {kv_pages.shape[:3]} to match kv_pages, got {kv_scales.shape}"
        )
    if kv_scales is None and jnp.dtype(kv_pages.dtype) in (
        jnp.dtype(jnp.int8),
        jnp.dtype(jnp.float8_e4m3fn),
    ):
        raise ValueError(f"kv_scales: required for a quantized kv_pages dtype {kv_pages.dtype}")


def _tiles(cu_q_lens, num_seqs, num_rows: int, q_tile: int, num_tiles: int):
    """Static-shape tile table: per tile its sequence and first row."""
    s = cu_q_lens.shape[0] - 1
    seq_valid = jnp.arange(s) < num_seqs
    q_lens = jnp.where(seq_valid, cu_q_lens[1:] - cu_q_lens[:-1], 0)
    tiles_per_seq = (q_lens + q_tile - 1) // q_tile
    cu_tiles = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(tiles_per_seq)])
    tile_idx = jnp.arange(num_tiles, dtype=jnp.int32)
    tile_seq = jnp.clip(jnp.searchsorted(cu_tiles, tile_idx, side="right") - 1, 0, s - 1)
    tile_valid = tile_idx < cu_tiles[-1]
    first = cu_q_lens[tile_seq] + (tile_idx - cu_tiles[tile_seq]) * q_tile
    return tile_seq.astype(jnp.int32), first.astype(jnp.int32), tile_valid, q_lens


def ragged_paged_attention(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_table: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    kv_scales: jax.Array | None = None,
    max_q_len: int | None = None,
    q_tile: int | None = None,
) -> jax.Array:
    """Attention of ragged new tokens over paged K/V (see module docstring).

    ``max_q_len`` is an optional static upper bound on new tokens per
    sequence (1 for decode-only steps); it only picks the tile size.
    """
    check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    t, hq, d = q.shape
    _, page_size, two_h, _ = kv_pages.shape
    hkv = two_h // 2
    g = hq // hkv
    s, p = page_table.shape
    c = p * page_size
    num_seqs = jnp.reshape(num_seqs, ()).astype(jnp.int32)
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)

    if q_tile is None:
        bound = t if max_q_len is None else min(max_q_len, t)
        q_tile = 1 if bound <= 1 else min(32, 1 << math.ceil(math.log2(bound)))
    num_tiles = t if q_tile == 1 else min(t, -(-t // q_tile) + s)
    num_tiles = max(num_tiles, 1)
    tile_seq, first, tile_valid, q_lens = _tiles(cu_q_lens, num_seqs, t, q_tile, num_tiles)

    # Query rows of each tile.
    local = jnp.arange(q_tile, dtype=jnp.int32)
    rows = first[:, None] + local[None, :]  # [NT, Bq]
    row_valid = tile_valid[:, None] & (rows < cu_q_lens[tile_seq + 1][:, None])
    rows_c = jnp.clip(rows, 0, t - 1)
    qt = q[rows_c].astype(jnp.float32)  # [NT, Bq, Hq, D]
    qt = qt.reshape(num_tiles, q_tile, hkv, g, d)

    # Each tile's pages, K and V gathered separately straight from a strided
    # view of the pool (XLA fuses the slice into the gather; gathering the
    # interleaved pages and splitting them afterwards is ~4x slower on CPU).
    pages = page_table[tile_seq]  # [NT, P]
    n_pages = kv_pages.shape[0]
    pool = kv_pages.reshape(n_pages, page_size, hkv, 2, d)
    k = pool[:, :, :, 0][pages].reshape(num_tiles, c, hkv, d)
    v = pool[:, :, :, 1][pages].reshape(num_tiles, c, hkv, d)
    if kv_scales is not None:
        sc = kv_scales.reshape(n_pages, page_size, hkv, 2)
        k = dequantize(k, sc[:, :, :, 0][pages].reshape(num_tiles, c, hkv))
        v = dequantize(v, sc[:, :, :, 1][pages].reshape(num_tiles, c, hkv))
    else:
        k = k.astype(jnp.float32)
        v = v.astype(jnp.float32)

    # Positions: query row i of seq s is at kv_len - q_len + i.
    kv_len_t = jnp.where(tile_valid, kv_lens[tile_seq], 0)  # [NT]
    q_pos = (kv_len_t - q_lens[tile_seq])[:, None] + (rows - cu_q_lens[tile_seq][:, None])
    key_pos = jnp.arange(c, dtype=jnp.int32)
    key_valid = key_pos[None, :] < kv_len_t[:, None]  # [NT, C]
    # Zero V outside the context so NaN garbage in unused pages cannot leak.
    v = jnp.where(key_valid[:, :, None, None], v, 0.0)

    scores = jnp.einsum("nqkgd,nckd->nkgqc", qt, k) * sm_scale  # [NT, Hkv, G, Bq, C]
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    mask = key_valid[:, None, :] & (key_pos[None, None, :] <= q_pos[:, :, None])  # [NT,Bq,C]
    if sliding_window is not None:
        mask = mask & (key_pos[None, None, :] > q_pos[:, :, None] - sliding_window)
    mask = mask & row_valid[:, :, None]
    scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
    m = jnp.max(scores, axis=-1, keepdims=True)
    e = jnp.where(mask[:, None, None, :, :], jnp.exp(scores - m), 0.0)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    probs = e / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("nkgqc,nckd->nqkgd", probs, v)  # [NT, Bq, Hkv, G, D]
    out = out.reshape(num_tiles * q_tile, hq, d).astype(q.dtype)

    # Scatter tile rows back to their flat positions; invalid rows are dropped.
    dest = jnp.where(row_valid, rows, t).reshape(-1)
    result = jnp.zeros((t, hq, d), q.dtype)
    return result.at[dest].set(out, mode="drop")


def naive_paged_attention(
    q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, sm_scale,
    sliding_window=None, soft_cap=None, kv_scales=None,
):
    """Slow, obviously-correct loop version (numpy on host) for tests."""
    import numpy as np

    q = np.asarray(q, np.float32)
    kvp = np.asarray(kv_pages.astype(jnp.float32))
    if kv_scales is not None:
        kvp = kvp * np.asarray(kv_scales)[..., None]
    kv_lens = np.asarray(kv_lens)
    page_table = np.asarray(page_table)
    cu = np.asarray(cu_q_lens)
    n = int(np.reshape(np.asarray(num_seqs), ()))
    t, hq, d = q.shape
    _, ps, two_h, _ = kvp.shape
    hkv = two_h // 2
    g = hq // hkv
    out = np.zeros_like(q)
    for s in range(n):
        ql = cu[s + 1] - cu[s]
        kl = kv_lens[s]
        if ql == 0:
            continue
        npages = -(-kl // ps)
        kv = kvp[page_table[s, :npages]].reshape(npages * ps, two_h, d)[:kl]
        for i in range(ql):
            pos = kl - ql + i
            for h in range(hq):
                kh = h // g
                sc = kv[: pos + 1, 2 * kh] @ q[cu[s] + i, h] * sm_scale
                if soft_cap is not None:
                    sc = soft_cap * np.tanh(sc / soft_cap)
                keys = np.arange(pos + 1)
                if sliding_window is not None:
                    sc = np.where(keys > pos - sliding_window, sc, -np.inf)
                w = np.exp(sc - sc.max())
                w /= w.sum()
                out[cu[s] + i, h] = w @ kv[: pos + 1, 2 * kh + 1]
    return out
