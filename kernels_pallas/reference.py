"""Ragged paged attention in plain jnp: the reference and the CPU backend.

Contract (shared by every backend in this package):

    q           [T, Hq, D]            new tokens of all sequences, flattened
    kv_pages    [N, 2, Hkv, page_size, D]   one layer's pool (see kv_write.py)
    kv_lens     i32[S]                context length incl. the new tokens
    page_table  i32[S, P]             physical page ids, 0-padded; with a sliding
                                      window, entries of pages wholly before a
                                      sequence's first query's window may be 0
                                      (never read: hybrid KV groups give them back)
    cu_q_lens   i32[S+1]              prefix sums of new-token counts
    num_seqs    i32[] or i32[1]       number of valid sequences (<= S)
    -> out      [T, Hq, D]            rows past cu_q_lens[num_seqs] are zero

Sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``; its last
``q_len`` tokens are the new ones, so query row ``i`` of sequence ``s`` sits at
position ``kv_lens[s] - q_len + i`` and sees keys ``0..that position``
(causal), or only the last ``sliding_window`` of them.

How this runs fast on a CPU: query rows are cut into tiles that never cross a
sequence boundary: one row per tile for sequences with one new token (decode),
``q_tile`` rows for prompt chunks. Each tile's key range (up to its last
row's position; from the window start) is cut into chunks of a few pages, and
the (tile, chunk) pairs form one flat work list, so work follows the real
contexts rather than the batch's longest one. A loop takes a block of items
at a time (flash-decoding style): gathers their K and V straight into the
batched-matmul layout ``[items, Hkv, chunk, D]`` (the head-major pool makes
that a plain gather, no transpose), scores them and folds the partial softmax
into the tiles' running max / sum / output. The trip count is dynamic, so a
wide page table costs nothing but its ids, and the working set stays in cache.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from pagedjax.kernels_pallas.kv_write import dequantize
from pagedjax.kernels_pallas.tiling import tile_table

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


def _attend_tiles(q, kv_pages, kv_scales, kv_lens, page_table, cu_q_lens, num_seqs, *,
                  q_tile: int, num_tiles: int, keep, pages_per_chunk: int, block: int,
                  sm_scale, sliding_window, soft_cap):
    """One tiling of the query rows; returns (tile rows [NT*Bq] or t, out [NT*Bq, Hq, D]).

    The work is a flat list of (tile, chunk of ``pages_per_chunk`` pages)
    items covering each tile's own key range (causal end, window start), so
    no tile pays for another's longer context. A loop takes ``block`` items
    at a time: gather their K/V, score, and fold the partial softmax into
    the tiles' running (max, sum, acc) with scatter updates.
    """
    t, hq, d = q.shape
    _, _, hkv, page_size, _ = kv_pages.shape
    g = hq // hkv
    m_rows = g * q_tile
    b = pages_per_chunk
    c = b * page_size
    nt = num_tiles
    tt = tile_table(cu_q_lens, kv_lens, num_seqs, q_tile, nt, keep)
    tile_seq, first, tile_valid, q_lens = tt.seq, tt.row0, tt.valid, tt.q_lens

    local = jnp.arange(q_tile, dtype=jnp.int32)
    rows = first[:, None] + local[None, :]  # [NT, Bq]
    row_valid = tile_valid[:, None] & (rows < cu_q_lens[tile_seq + 1][:, None])
    qt = q[jnp.clip(rows, 0, t - 1)].astype(jnp.float32) * sm_scale  # [NT, Bq, Hq, D]
    qt = qt.reshape(nt, q_tile, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(nt, hkv, m_rows, d)
    pages = page_table[tile_seq]  # [NT, P]
    kv_len_t = jnp.where(tile_valid, kv_lens[tile_seq], 0)
    q_pos = (kv_len_t - q_lens[tile_seq])[:, None] + (rows - cu_q_lens[tile_seq][:, None])

    # Each tile's key range [k_lo, k_hi) and its chunks.
    k_hi = jnp.where(tile_valid, q_pos[:, 0] + jnp.sum(row_valid, axis=1), 0)
    k_lo = jnp.zeros_like(k_hi)
    if sliding_window is not None:
        k_lo = jnp.clip(q_pos[:, 0] - sliding_window + 1, 0, None)
    c_lo = k_lo // c
    n_items = jnp.where(tile_valid, jnp.maximum((k_hi + c - 1) // c - c_lo, 0), 0)
    cu_items = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(n_items)])
    total = cu_items[-1]
    max_col = pages.shape[1] - 1  # a chunk past the table's end reads its last page, masked

    def gather(ids, kv):  # ids [W, b] -> [W, Hkv, c, D] (f32)
        x = kv_pages[ids, kv]  # [W, b, Hkv, ps, D]
        sc = None if kv_scales is None else kv_scales[ids, kv]  # [W, b, Hkv, ps]
        if b > 1:
            x = x.transpose(0, 2, 1, 3, 4)
            sc = None if sc is None else sc.transpose(0, 2, 1, 3)
        x = x.reshape(block, hkv, c, d)
        sc = None if sc is None else sc.reshape(block, hkv, c)
        return dequantize(x, sc)

    def body(j, carry):
        m_t, l_t, acc_t = carry  # [NT, Hkv, M], [NT, Hkv, M], [NT, Hkv, M, D]
        ids = j * block + jnp.arange(block, dtype=jnp.int32)
        it_valid = ids < total
        it = jnp.clip(jnp.searchsorted(cu_items, ids, side="right") - 1, 0, nt - 1)
        chunk = c_lo[it] + ids - cu_items[it]
        cols = jnp.clip(chunk[:, None] * b + jnp.arange(b, dtype=jnp.int32), 0, max_col)
        pg = pages[it[:, None], cols]  # [W, b]
        k = gather(pg, 0)
        v = gather(pg, 1)
        key_pos = chunk[:, None] * c + jnp.arange(c, dtype=jnp.int32)  # [W, c]
        # Keys before the tile's window start may sit on pages a sliding-window KV
        # group gave back (the null page in the table): out of the context too.
        key_valid = (key_pos < kv_len_t[it][:, None]) & (key_pos >= k_lo[it][:, None])
        # Zero V outside the context so NaN garbage in unused pages cannot leak.
        v = jnp.where(key_valid[:, None, :, None], v, 0.0)
        if q_tile == 1:  # decode rows (M = G): K @ q^T suits XLA:CPU's small batched dots better
            scores = jnp.einsum("nkcd,nkmd->nkcm", k, qt[it]).swapaxes(-1, -2)
        else:
            scores = jnp.einsum("nkmd,nkcd->nkmc", qt[it], k)
        if soft_cap is not None:
            scores = soft_cap * jnp.tanh(scores / soft_cap)
        qp = q_pos[it]  # [W, Bq]
        mask = (key_valid[:, None, :] & (key_pos[:, None, :] <= qp[:, :, None])
                & (row_valid[it] & it_valid[:, None])[:, :, None])  # [W, Bq, c]
        if sliding_window is not None:
            mask = mask & (key_pos[:, None, :] > qp[:, :, None] - sliding_window)
        mask = jnp.broadcast_to(mask[:, None], (block, g, q_tile, c)).reshape(block, 1, m_rows, c)
        scores = jnp.where(mask, scores, _NEG_INF)
        m_i = jnp.max(scores, axis=-1)  # [W, Hkv, M]
        probs = jnp.where(mask, jnp.exp(scores - m_i[..., None]), 0.0)
        l_i = jnp.sum(probs, axis=-1)
        acc_i = jnp.einsum("nkmc,nkcd->nkmd", probs, v)
        # Fold into the tiles (a tile's items are consecutive; several may
        # share this block): new max, rescale each touched tile once, add.
        tgt = jnp.where(it_valid, it, nt)
        m_new = m_t.at[tgt].max(m_i, mode="drop")
        alpha = jnp.exp(m_t - m_new)  # [NT, Hkv, M], 1 for untouched tiles
        w_i = jnp.exp(m_i - m_new[it])
        l_t = (l_t * alpha).at[tgt].add(l_i * w_i, mode="drop")
        prev = jnp.concatenate([jnp.full((1,), -1, jnp.int32), it[:-1]])
        first_of_tile = jnp.where(it_valid & (it != prev), it, nt)
        acc_t = acc_t.at[first_of_tile].multiply(alpha[it][..., None], mode="drop")
        acc_t = acc_t.at[tgt].add(acc_i * w_i[..., None], mode="drop")
        return m_new, l_t, acc_t

    m0 = jnp.full((nt, hkv, m_rows), _NEG_INF, jnp.float32)
    l0 = jnp.zeros((nt, hkv, m_rows), jnp.float32)
    a0 = jnp.zeros((nt, hkv, m_rows, d), jnp.float32)
    _, l_t, acc_t = jax.lax.fori_loop(0, (total + block - 1) // block, body, (m0, l0, a0))
    out = acc_t / jnp.where(l_t > 0, l_t, 1.0)[..., None]
    out = out.reshape(nt, hkv, g, q_tile, d).transpose(0, 3, 1, 2, 4)
    out = out.reshape(nt * q_tile, hq, d)
    dest = jnp.where(row_valid, rows, t).reshape(-1)
    return dest, out


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
    sequence (1 for decode-only steps). Sequences with one new token are
    tiled a row at a time; longer ones in tiles of ``q_tile`` rows (default
    16). ``pages_per_chunk`` is the pages each work item reads.
    """
    check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    t, hq, d = q.shape
    page_size = kv_pages.shape[3]
    s, p = page_table.shape
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    result = jnp.zeros((t, hq, d), q.dtype)

    def attend(result, *, q_tile, num_tiles, keys, block, keep):
        b = max(1, min(pages_per_chunk or keys // page_size, p))
        dest, out = _attend_tiles(
            q, kv_pages, kv_scales, kv_lens.astype(jnp.int32), page_table.astype(jnp.int32),
            cu_q_lens, jnp.reshape(num_seqs, ()).astype(jnp.int32), q_tile=q_tile,
            num_tiles=max(num_tiles, 1), keep=keep, pages_per_chunk=b, block=block,
            sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap)
        return result.at[dest].set(out.astype(q.dtype), mode="drop")

    # Single-token rows (every decode row): one row per tile, ~32 keys per item
    # (~64 for a handful of rows: fewer, fuller loop trips).
    result = attend(result, q_tile=1, num_tiles=min(s, t), keys=64 if min(s, t) <= 16 else 32,
                    block=32, keep=None if max_q_len == 1 else q_lens == 1)
    if max_q_len is None or max_q_len > 1:
        # Multi-token rows (prompt chunks): tiles of q_tile rows, ~64 keys per item.
        bq = q_tile or (16 if max_q_len is None else min(16, 1 << math.ceil(math.log2(max_q_len))))
        result = attend(result, q_tile=bq, num_tiles=min(t, -(-t // bq) + min(s, t // 2)),
                        keys=64, block=16, keep=q_lens > 1)
    return result


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
