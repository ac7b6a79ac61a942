"""Ragged paged attention as a Pallas kernel lowered through Triton (GPU).

Same contract as ``reference.py`` (q [T, Hq, D], kv_pages
[N, 2, Hkv, page_size, D] as laid out by ``kv_write.py``, kv_lens,
page_table, cu_q_lens, num_seqs, optional per-token-per-head ``kv_scales``
[N, 2, Hkv, page_size] for int8 / fp8 caches).

Design
------
Query tiles. The batch is cut, in jnp, into *query tiles*: runs of at most
``BQ`` consecutive query rows of one sequence (a decode row is a tile by
itself when ``max_q_len == 1``). The tile table (first flat row, row count,
position of the first row, kv length, sequence id) is computed from
``cu_q_lens`` with a static tile count (``T`` for decode, else
``ceil(T / BQ) + S``, as the reference does) and handed to the kernel as
plain int32 arrays that each program reads as scalars. Tiles past the last
valid sequence have zero rows and do no work.

GQA. ``q`` is transposed in jnp to ``[Hkv, T*G, D]`` (G = Hq/Hkv), so the
``BQ*G`` query rows of a tile for one KV head are contiguous: row
``r = i*G + g`` is query ``i`` of the tile, head ``g`` of the group. One
program handles all G heads of its KV head, so each K/V row is read once per
tile; the ``M = next_pow2(max(BQ*G, 16))`` rows are one ``tl.dot`` operand.

Grid ``(num_tiles, Hkv, kv_splits)`` (flash-decoding). The key range a tile
needs (``[max(0, first_pos - window + 1), min(kv_len, last_pos + 1))``) is cut
into ``BK``-token blocks, and those blocks are split evenly over the
``kv_splits`` programs of the third grid axis, so a handful of long decode
sequences still fills all SMs. ``kv_splits`` is static (auto: enough
programs for ~2 waves on a 132-SM GPU, at most one per block of the longest
possible context, at most 16). With one split the kernel normalises and
writes the output directly; with several it writes partial
``(acc, m, l)`` in f32 and a jnp step combines them (log-sum-exp merge).

K/V blocks are read page by page. The pool is viewed as
``[N*2*Hkv, page_size, D]``: *plane* ``(page*2 + kv)*Hkv + h`` is the
contiguous ``[page_size, D]`` block of head ``h``'s keys (``kv = 0``) or
values (``kv = 1``) on that page. A key block is ``PPB`` *chunks* of ``R``
rows (``PPB * R = BK``, both powers of two): with pages of at most ``BK``
tokens a chunk is a whole page (``R = next_pow2(page_size)``, ``PPB = BK /
R`` pages per block); with larger pages a block is one ``R = BK``-row slice
of one page. The kernel loads the ``PPB`` page ids of a block from the page
table (one vector load), then each chunk as a dense ``[R, D]`` tile of its
plane (one ``[PPB, R, D]`` masked load, rows and columns contiguous within a
chunk), reshaped to the ``[BK, D]`` dot operand; the scales of a chunk are
likewise one contiguous run of its scale plane. Keys outside the context
(and the padding rows of a non-power-of-two page) are masked at load time,
so NaN garbage in unused pages is never read. Any page size works; a power
of two wastes no lanes.

Quantized caches: K and V are cast to the compute dtype (that of q) before
the dots; the K scale multiplies the logits' columns and the V scale the
probabilities' columns, which equals dequantising K and V.

Softmax is online in f32 (running max ``m``, sum ``l``, accumulator
``acc``); masked logits are replaced (not added to) and their probabilities
forced to 0, so fully masked rows give 0, never NaN.

Block sizes, warps and stages: ``triton_plan.py`` (register headroom, and
the variants whose key block is halved to stay clear of an occupancy step).

Native limits (checked, ValueError): head_dim a power of two >= 16 (Triton
dot); ``interpret=True`` accepts any power of two so CPU tests can stay tiny.
``block_k`` must be a power of two >= 16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pagedjax.kernels_pallas.reference import check_args
from pagedjax.kernels_pallas.pallas.triton_plan import (  # noqa: F401 - plan names, re-exported
    NUM_STAGES, NUM_WARPS, chunk_geometry, mixed_rows, plan)
from pagedjax.kernels_pallas.tiling import tile_table

_NEG = -1e30


def _compiler_params(num_warps: int, num_stages: int):
    """Triton compiler params; the class was renamed across JAX versions."""
    cls = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")
    return cls(num_warps=num_warps, num_stages=num_stages)


def _gpu_load(ref, mask, other):
    load = getattr(plgpu, "load", None)
    if load is not None:
        return load(ref, mask=mask, other=other)
    return pl.load(ref, (), mask=mask, other=other)  # pragma: no cover (old API)


def _gpu_store(ref, val, mask):
    store = getattr(plgpu, "store", None)
    if store is not None:
        return store(ref, val, mask=mask)
    return pl.store(ref, (), val, mask=mask)  # pragma: no cover (old API)


def _kernel(
    # scalar tables
    row0_ref, nrows_ref, pos0_ref, kvlen_ref, seq_ref, pt_ref,
    # tensors
    q_ref, kv_ref, *rest,
    quantized: bool, g: int, m_rows: int, page_size: int, rows_per_chunk: int,
    chunks_per_page: int, chunks_per_block: int, pages_per_seq: int, hkv: int,
    sm_scale: float, soft_cap, window, splits: int, compute_dtype, precision,
):
    if quantized:
        sc_ref, *outs = rest
    else:
        sc_ref, outs = None, list(rest)
    ps, rc, nsub, ppb = page_size, rows_per_chunk, chunks_per_page, chunks_per_block
    block_k = ppb * rc
    t = pl.program_id(0)
    h = pl.program_id(1)
    sp = pl.program_id(2)

    row0 = row0_ref[t]
    nrows = nrows_ref[t]
    pos0 = pos0_ref[t]
    kv_len = kvlen_ref[t]
    seq = seq_ref[t]

    r = jnp.arange(m_rows, dtype=jnp.int32)
    qi = r // g
    row_ok = qi < nrows
    q_pos = pos0 + qi  # [M]
    d = q_ref.shape[-1]
    q = _gpu_load(q_ref.at[h, pl.ds(row0 * g, m_rows), :], row_ok[:, None], 0.0)
    q = q.astype(compute_dtype)

    def chunk_of(x):  # chunk holding key position x
        if nsub == 1:
            return x // ps
        return (x // ps) * nsub + (x % ps) // rc

    # Keys this tile can see, as a chunk range and a block range, then this
    # split's share of the blocks.
    hi = jnp.minimum(jnp.minimum(kv_len, pos0 + nrows), pages_per_seq * ps)
    lo = 0 if window is None else jnp.maximum(pos0 - window + 1, 0)
    live = (nrows > 0) & (hi > lo)
    c_lo = chunk_of(lo)
    c_hi = chunk_of(jnp.maximum(hi - 1, 0))  # last chunk with a visible key
    b_lo = c_lo // ppb
    b_hi = jnp.where(live, c_hi // ppb + 1, b_lo)
    nblk = jnp.maximum(b_hi - b_lo, 0)
    per = (nblk + splits - 1) // splits
    b_start = b_lo + sp * per
    b_end = jnp.minimum(b_start + per, b_hi)

    ci = jnp.arange(ppb, dtype=jnp.int32)
    rr = jnp.arange(rc, dtype=jnp.int32)
    # Loads index with arrays on every axis (what both Triton and the
    # interpreter accept): [PPB, 1, 1] planes x [1, R, 1] rows x [1, 1, D].
    dcol = jnp.arange(d, dtype=jnp.int32)

    def body(b, carry):
        acc, m_i, l_i = carry
        c = b * ppb + ci  # [PPB] chunks of this block
        if nsub == 1:
            pg, row = c, rr  # a chunk is a whole page
        else:  # PPB == 1: one R-row slice of one page
            pg, row = c // nsub, (b % nsub) * rc + rr
        c_ok = (c >= c_lo) & (c <= c_hi)  # also keeps pg < pages_per_seq
        k_pos2 = (pg * ps)[:, None] + row[None, :]  # [PPB, R]
        k_ok2 = c_ok[:, None] & (k_pos2 >= lo) & (k_pos2 < hi)
        if ps % rc:  # padding rows of a non-power-of-two page
            k_ok2 = k_ok2 & (row < ps)[None, :]
            row = jnp.minimum(row, ps - 1)
        page = _gpu_load(pt_ref.at[seq * pages_per_seq + pg], c_ok, 0)  # [PPB]
        plane = page * (2 * hkv) + h  # K of head h; V is plane + hkv
        pidx, ridx = plane[:, None, None], row[None, :, None]
        k_pos = k_pos2.reshape(block_k)
        k_ok = k_ok2.reshape(block_k)
        # No ``other``: Triton cannot splat an int fill into fp8; masked keys
        # are dropped from the logits below and zeroed in V.
        k = _gpu_load(kv_ref.at[pidx, ridx, dcol[None, None, :]], k_ok2[:, :, None], None)
        k = k.reshape(block_k, d).astype(compute_dtype)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32, precision=precision)
        if quantized:
            k_sc = _gpu_load(sc_ref.at[plane[:, None], row[None, :]], k_ok2, 0.0)
            s = s * (k_sc.reshape(block_k)[None, :] * sm_scale)
        else:
            s = s * sm_scale
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        mask = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]) & row_ok[:, None]
        if window is not None:
            mask = mask & (k_pos[None, :] > q_pos[:, None] - window)
        s = jnp.where(mask, s, _NEG)
        m_new = jnp.maximum(m_i, jnp.max(s, axis=1))
        alpha = jnp.exp(m_i - m_new)
        p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
        l_new = l_i * alpha + jnp.sum(p, axis=1)
        v = _gpu_load(kv_ref.at[pidx + hkv, ridx, dcol[None, None, :]], k_ok2[:, :, None], None)
        v = v.reshape(block_k, d)
        v = jnp.where(k_ok[:, None], v.astype(compute_dtype), jnp.zeros((), compute_dtype))
        if quantized:
            v_sc = _gpu_load(sc_ref.at[plane[:, None] + hkv, row[None, :]], k_ok2, 0.0)
            p = p * v_sc.reshape(block_k)[None, :]
        pv = lax.dot_general(p.astype(compute_dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32, precision=precision)
        return acc * alpha[:, None] + pv, m_new, l_new

    acc = jnp.zeros((m_rows, d), jnp.float32)
    m_i = jnp.full((m_rows,), _NEG, jnp.float32)
    l_i = jnp.zeros((m_rows,), jnp.float32)
    acc, m_i, l_i = lax.fori_loop(b_start, b_end, body, (acc, m_i, l_i))

    rows = pl.ds(row0 * g, m_rows)
    if splits == 1:
        (o_ref,) = outs
        out = acc / jnp.where(l_i > 0, l_i, 1.0)[:, None]
        _gpu_store(o_ref.at[h, rows, :], out.astype(o_ref.dtype), row_ok[:, None])
    else:
        o_ref, m_ref, l_ref = outs
        _gpu_store(o_ref.at[sp, h, rows, :], acc, row_ok[:, None])
        _gpu_store(m_ref.at[sp, h, rows], m_i, row_ok)
        _gpu_store(l_ref.at[sp, h, rows], l_i, row_ok)


def _check_kernel_args(q, kv_pages, interpret: bool) -> None:
    d = q.shape[-1]
    if d & (d - 1):
        raise ValueError(f"head_dim: the Triton kernel needs a power of two, got {d}")
    if not interpret and d < 16:
        raise ValueError(f"head_dim: the Triton kernel needs head_dim >= 16 natively, got {d}")
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
                                  jnp.dtype(jnp.float16)):
        raise ValueError(f"q: dtype must be float32, bfloat16 or float16, got {q.dtype}")
    if jnp.dtype(kv_pages.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
                                         jnp.dtype(jnp.float16), jnp.dtype(jnp.int8),
                                         jnp.dtype(jnp.float8_e4m3fn)):
        raise ValueError(f"kv_pages: unsupported dtype {kv_pages.dtype}")
    if not interpret and jnp.dtype(kv_pages.dtype) == jnp.dtype(jnp.float8_e4m3fn):
        cc = compute_capability()
        if cc is not None and cc < (8, 9):
            raise ValueError(
                f"kv_pages: fp8 pages need a GPU of compute capability >= 8.9 (Ada, Hopper); "
                f"this one is {cc[0]}.{cc[1]}: use kv_cache_dtype='int8' or 'auto'")


def compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability, None without one."""
    try:
        dev = jax.devices("gpu")[0]
    except RuntimeError:
        return None
    cc = getattr(dev, "compute_capability", None)
    if not cc:
        return None
    major, minor = str(cc).split(".")
    return int(major), int(minor)


def ragged_paged_attention(
    q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *,
    sm_scale: float, sliding_window: int | None = None, soft_cap: float | None = None,
    kv_scales=None, max_q_len: int | None = None, interpret: bool = False,
    block_q: int | None = None, block_k: int | None = None, kv_splits: int | None = None,
    num_warps: int | None = None, num_stages: int = NUM_STAGES,
):
    """Triton-lowered ragged paged attention (contract: ``reference.py``).

    ``kv_pages`` is ``[num_pages, 2, num_kv_heads, page_size, head_dim]`` and
    ``kv_scales`` (quantized caches only) ``[num_pages, 2, num_kv_heads,
    page_size]`` float32, as written by ``kv_write.write_kv``.
    """
    check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    _check_kernel_args(q, kv_pages, bool(interpret))
    if kv_scales is not None and jnp.dtype(kv_scales.dtype) != jnp.dtype(jnp.float32):
        raise ValueError(f"kv_scales: expected float32, got {kv_scales.dtype}")
    if sliding_window is not None and int(sliding_window) < 1:
        raise ValueError(f"sliding_window: must be >= 1, got {sliding_window}")
    if soft_cap is not None and float(soft_cap) <= 0:
        raise ValueError(f"soft_cap: must be > 0, got {soft_cap}")
    t, hq, d = q.shape
    _, _, hkv, page_size, _ = kv_pages.shape
    s, p = page_table.shape
    bq, m_rows, bk, num_tiles, splits = plan(
        t, s, hq, hkv, d, page_size, p, max_q_len, block_q, block_k, kv_splits,
        page_dtype=jnp.dtype(kv_pages.dtype).name, window=sliding_window is not None,
        soft_cap=soft_cap is not None)
    if num_warps is None:
        num_warps = NUM_WARPS
    return _run(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, kv_scales,
                sm_scale=float(sm_scale),
                sliding_window=None if sliding_window is None else int(sliding_window),
                soft_cap=None if soft_cap is None else float(soft_cap),
                interpret=bool(interpret), bq=bq, m_rows=m_rows, bk=bk,
                num_tiles=num_tiles, splits=splits, num_warps=num_warps,
                num_stages=num_stages)


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "interpret", "bq", "m_rows", "bk",
    "num_tiles", "splits", "num_warps", "num_stages"))
def _run(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, kv_scales, *,
         sm_scale, sliding_window, soft_cap, interpret, bq, m_rows, bk, num_tiles,
         splits, num_warps, num_stages):
    t, hq, d = q.shape
    n, _, hkv, page_size, _ = kv_pages.shape
    g = hq // hkv
    s, p = page_table.shape
    rc, nsub, ppb = chunk_geometry(page_size, bk)
    num_seqs = jnp.reshape(num_seqs, ()).astype(jnp.int32)
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    tt = tile_table(cu_q_lens, kv_lens, num_seqs, bq, num_tiles)
    row0, nrows, pos0, kvlen, seq = tt.row0, tt.nrows, tt.pos0, tt.kv_len, tt.seq

    # [T, Hq, D] -> [Hkv, T*G, D]; padded at the end so a tile's M-row window
    # never leaves the array (rows past the tile are masked anyway).
    qh = q.reshape(t, hkv, g, d).transpose(1, 0, 2, 3).reshape(hkv, t * g, d)
    rows_pad = t * g + m_rows
    qh = jnp.pad(qh, ((0, 0), (0, m_rows), (0, 0)))
    # Planes: [N, 2, Hkv, ps, D] -> [N*2*Hkv, ps, D] (a free reshape).
    kv_planes = kv_pages.reshape(n * 2 * hkv, page_size, d)
    quantized = kv_scales is not None
    compute_dtype = jnp.float32 if q.dtype == jnp.float32 else q.dtype
    precision = lax.Precision.HIGHEST if compute_dtype == jnp.float32 else None

    kernel = functools.partial(
        _kernel, quantized=quantized, g=g, m_rows=m_rows, page_size=page_size,
        rows_per_chunk=rc, chunks_per_page=nsub, chunks_per_block=ppb, pages_per_seq=p,
        hkv=hkv, sm_scale=sm_scale, soft_cap=soft_cap, window=sliding_window,
        splits=splits, compute_dtype=compute_dtype, precision=precision)
    inputs = [row0, nrows, pos0, kvlen, seq, page_table.astype(jnp.int32).reshape(-1), qh,
              kv_planes]
    if quantized:
        inputs.append(kv_scales.reshape(n * 2 * hkv, page_size))
    if splits == 1:
        out_shape = [jax.ShapeDtypeStruct((hkv, rows_pad, d), q.dtype)]
    else:
        out_shape = [jax.ShapeDtypeStruct((splits, hkv, rows_pad, d), jnp.float32),
                     jax.ShapeDtypeStruct((splits, hkv, rows_pad), jnp.float32),
                     jax.ShapeDtypeStruct((splits, hkv, rows_pad), jnp.float32)]
    outs = pl.pallas_call(
        kernel,
        grid=(num_tiles, hkv, splits),
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=_compiler_params(num_warps, num_stages),
        name=f"ragged_paged_attention_m{m_rows}_k{bk}_s{splits}",
    )(*inputs)

    if splits == 1:
        o = outs[0][:, : t * g].astype(jnp.float32)
    else:
        o_part, m_part, l_part = (a[:, :, : t * g] for a in outs)
        m_max = jnp.max(m_part, axis=0)
        w = jnp.exp(m_part - m_max[None])  # splits with no keys have m = -1e30 -> 0
        l_tot = jnp.sum(w * l_part, axis=0)
        o = jnp.sum(w[..., None] * o_part, axis=0) / jnp.where(l_tot > 0, l_tot, 1.0)[..., None]
    o = o.reshape(hkv, t, g, d).transpose(1, 0, 2, 3).reshape(t, hq, d)
    # Rows past cu_q_lens[num_seqs] belong to no tile: the kernel never wrote them.
    valid = jnp.arange(t) < cu_q_lens[num_seqs]
    return jnp.where(valid[:, None, None], o, 0.0).astype(q.dtype)
