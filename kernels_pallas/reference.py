"""Ragged paged attention in plain jnp: the reference and the CPU backend.

Contract (shared by every backend in this package):

    q           [T, Hq, D]            new tokens of all sequences, flattened
    kv_pages    [N, 2, Hkv, page_size, D]   one layer's pool (see kv_write.py)
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
that never cross a sequence boundary (with ``max_q_len == 1``, a pure decode
step, a tile is one row). A loop walks the context in chunks of a few pages
with an online softmax (flash attention): each chunk gathers the tiles' K and
V straight into the batched-matmul layout ``[tiles, Hkv, chunk, D]`` (the
head-major pool makes that a plain gather, no transpose), so the working set
stays in cache instead of materializing every tile's whole context. The loop
runs only as far as the longest context in the batch (a dynamic trip count),
so a wide page table costs nothing but its ids.
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
    if kv_pages.ndim != 5 or kv_pages.shape[1] != 2:
        raise ValueError(
            "kv_pages: expected [num_pages, 2, num_kv_heads, page_size, head_dim], "
            f"got {kv_pages.shape}"
        )
    t, hq, d = q.shape
    _, _, hkv, _, dk = kv_pages.shape
    if dk != d:
        raise ValueError(f"kv_pages: head_dim {dk} does not match q head_dim {d}")
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
    if kv_scales is not None and kv_scales.shape != kv_pages.shape[:4]:
        raise ValueError(
            f"kv_scales: expected shape {kv_pages.shape[:4]} to match kv_pages, got {kv_scales.shape}"
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
    pages_per_chunk: int | None = None,
) -> jax.Array:
    """Attention of ragged new tokens over paged K/V (see module docstring).

    ``max_q_len`` is an optional static upper bound on new tokens per
    sequence (1 for decode-only steps); it only picks the tile size.
    ``pages_per_chunk`` is the number of pages each loop iteration reads.
    """
    check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    t, hq, d = q.shape
    _, _, hkv, page_size, _ = kv_pages.shape
    g = hq // hkv
    s, p = page_table.shape
    num_seqs = jnp.reshape(num_seqs, ()).astype(jnp.int32)
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    page_table = page_table.astype(jnp.int32)

    if q_tile is None:
        bound = t if max_q_len is None else min(max_q_len, t)
        q_tile = 1 if bound <= 1 else min(32, 1 << math.ceil(math.log2(bound)))
    num_tiles = t if q_tile == 1 else min(t, -(-t // q_tile) + s)
    num_tiles = max(num_tiles, 1)
    tile_seq, first, tile_valid, q_lens = _tiles(cu_q_lens, num_seqs, t, q_tile, num_tiles)
    if pages_per_chunk is None:  # ~32 keys per step when decoding, ~128 for prompt tiles
        pages_per_chunk = max(1, (32 if q_tile == 1 else 128) // page_size)
    b = max(1, min(pages_per_chunk, p))
    if p % b:
        page_table = jnp.pad(page_table, ((0, 0), (0, b - p % b)))
    c = b * page_size  # keys per chunk

    # Query rows of each tile, as [NT, Hkv, G*Bq, D] (the matmul's M = G*Bq).
    local = jnp.arange(q_tile, dtype=jnp.int32)
    rows = first[:, None] + local[None, :]  # [NT, Bq]
    row_valid = tile_valid[:, None] & (rows < cu_q_lens[tile_seq + 1][:, None])
    qt = q[jnp.clip(rows, 0, t - 1)].astype(jnp.float32) * sm_scale  # [NT, Bq, Hq, D]
    qt = qt.reshape(num_tiles, q_tile, hkv, g, d).transpose(0, 2, 3, 1, 4)
    qt = qt.reshape(num_tiles, hkv, g * q_tile, d)

    pages = page_table[tile_seq]  # [NT, P']
    kv_len_t = jnp.where(tile_valid, kv_lens[tile_seq], 0)  # [NT]
    q_pos = (kv_len_t - q_lens[tile_seq])[:, None] + (rows - cu_q_lens[tile_seq][:, None])
    # Chunks to visit: up to the longest context; with a window, from the
    # earliest key any valid row still sees.
    hi = (jnp.max(kv_len_t) + c - 1) // c
    lo = jnp.int32(0)
    if sliding_window is not None:
        first_key = jnp.where(row_valid, q_pos - sliding_window + 1, jnp.iinfo(jnp.int32).max)
        lo = jnp.clip(jnp.min(first_key), 0, None) // c
        lo = jnp.minimum(lo, hi)

    def gather(ids, kv):  # ids [NT, b] -> [NT, Hkv, c, D] (f32)
        x = kv_pages[ids, kv]  # [NT, b, Hkv, ps, D]
        sc = None if kv_scales is None else kv_scales[ids, kv]  # [NT, b, Hkv, ps]
        if b > 1:
            x = x.transpose(0, 2, 1, 3, 4)
            sc = None if sc is None else sc.transpose(0, 2, 1, 3)
        x = x.reshape(num_tiles, hkv, c, d)
        sc = None if sc is None else sc.reshape(num_tiles, hkv, c)
        return dequantize(x, sc)

    def body(j, carry):
        m, l, acc = carry  # [NT, Hkv, G*Bq], same, [NT, Hkv, G*Bq, D]
        ids = jax.lax.dynamic_slice_in_dim(pages, j * b, b, axis=1)
        k = gather(ids, 0)
        v = gather(ids, 1)
        key_pos = j * c + jnp.arange(c, dtype=jnp.int32)
        key_valid = key_pos[None, :] < kv_len_t[:, None]  # [NT, c]
        # Zero V outside the context so NaN garbage in unused pages cannot leak.
        v = jnp.where(key_valid[:, None, :, None], v, 0.0)
        scores = jnp.einsum("nkmd,nkcd->nkmc", qt, k)
        if soft_cap is not None:
            scores = soft_cap * jnp.tanh(scores / soft_cap)
        mask = key_valid[:, None, :] & (key_pos[None, None, :] <= q_pos[:, :, None])  # [NT,Bq,c]
        if sliding_window is not None:
            mask = mask & (key_pos[None, None, :] > q_pos[:, :, None] - sliding_window)
        mask = mask & row_valid[:, :, None]
        mask = jnp.broadcast_to(mask[:, None, None], (num_tiles, 1, g, q_tile, c))
        mask = mask.reshape(num_tiles, 1, g * q_tile, c)
        scores = jnp.where(mask, scores, _NEG_INF)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        probs = jnp.where(mask, jnp.exp(scores - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        l = l * corr + jnp.sum(probs, axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("nkmc,nkcd->nkmd", probs, v)
        return m_new, l, acc

    m0 = jnp.full((num_tiles, hkv, g * q_tile), _NEG_INF, jnp.float32)
    l0 = jnp.zeros((num_tiles, hkv, g * q_tile), jnp.float32)
    a0 = jnp.zeros((num_tiles, hkv, g * q_tile, d), jnp.float32)
    _, l, acc = jax.lax.fori_loop(lo, hi, body, (m0, l0, a0))
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]
    out = out.reshape(num_tiles, hkv, g, q_tile, d).transpose(0, 3, 1, 2, 4)
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
    kvp = np.asarray(kv_pages.astype(jnp.float32))  # [N, 2, Hkv, ps, D]
    if kv_scales is not None:
        kvp = kvp * np.asarray(kv_scales)[..., None]
    kv_lens = np.asarray(kv_lens)
    page_table = np.asarray(page_table)
    cu = np.asarray(cu_q_lens)
    n = int(np.reshape(np.asarray(num_seqs), ()))
    t, hq, d = q.shape
    _, _, hkv, ps, _ = kvp.shape
    g = hq // hkv
    out = np.zeros_like(q)
    for s in range(n):
        ql = cu[s + 1] - cu[s]
        kl = kv_lens[s]
        if ql == 0:
            continue
        npages = -(-kl // ps)
        # [npages, 2, Hkv, ps, D] -> [2, Hkv, npages*ps, D], first kl tokens
        kv = kvp[page_table[s, :npages]].transpose(1, 2, 0, 3, 4).reshape(2, hkv, npages * ps, d)
        kv = kv[:, :, :kl]
        for i in range(ql):
            pos = kl - ql + i
            for h in range(hq):
                kh = h // g
                sc = kv[0, kh, : pos + 1] @ q[cu[s] + i, h] * sm_scale
                if soft_cap is not None:
                    sc = soft_cap * np.tanh(sc / soft_cap)
                keys = np.arange(pos + 1)
                if sliding_window is not None:
                    sc = np.where(keys > pos - sliding_window, sc, -np.inf)
                w = np.exp(sc - sc.max())
                w /= w.sum()
                out[cu[s] + i, h] = w @ kv[1, kh, : pos + 1]
    return out
