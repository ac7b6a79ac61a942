"""Ragged paged attention as a Pallas kernel lowered through Mosaic (TPU).

Same contract as ``reference.py``; pool layout as in ``kv_write.py``:
``kv_pages [N, 2, Hkv, page_size, D]`` (axis 1: K, V), quantized scales
``kv_scales [N, 2, Hkv, page_size]`` f32. Runs natively on TPU and, on CPU,
in the TPU interpreter (``interpret=True`` becomes ``pltpu.InterpretParams()``).

Design
------
Query tiles as in ``triton_gpu.py``: jnp cuts the batch into tiles of at most
``BQ`` rows of one sequence (``BQ = 1`` for decode) and gathers each tile's
queries into ``q_tiles [NT, Hkv, M, D]``, row ``r = i*G + g`` = query ``i``,
head ``g`` of the KV head's group, ``M`` = ``BQ*G`` rounded up to 16 rows
(sublane tiles). The kernel writes ``[NT, Hkv, M, D]`` and jnp scatters the
valid rows back to ``[T, Hq, D]``.

Grid ``(NT,)`` with ``PrefetchScalarGridSpec``: the tile table (rows, first
position, kv length, sequence) and the flattened page table are scalar
prefetch (SMEM). One program handles *all* KV heads of its tile, so each page
is copied once: a page is one contiguous ``[2, Hkv, page_size, D]`` block of
the pool, so K and V of all heads arrive in one DMA. ``kv_pages`` (and
``kv_scales``) stay in HBM (``memory_space=pl.ANY``); blocks of ``PPB`` pages
(``BK = PPB*page_size`` tokens) are copied into a two-slot VMEM buffer
``[2, PPB, 2, Hkv, page_size, D]`` with ``pltpu.make_async_copy`` (page ``j``
of a block into ``buf[slot, j]``), one DMA semaphore per slot: block ``b+1``
is in flight while block ``b`` is computed. Pages past the context are
fetched from the null page 0 (cheap, keeps start/wait paired) and masked.

In VMEM, K of head ``h`` is ``buf[slot, :, 0, h]`` (V: ``[slot, :, 1, h]``):
a ``[PPB, page_size, D]`` load indexed on leading dims only, whose last two
dims are whole ``(sublane, 128-lane)`` tiles, folded to ``[BK, D]`` by a
value reshape (narrow dtypes are widened to f32 first when ``page_size`` is
not a multiple of their packed sublane tile; the JAX TPU paged-attention
kernels fold the same way). No strided loads, no reshape of a ref (the
interpreter cannot do those).

Quantized pools: the scales of a page, ``[2, Hkv, page_size]`` f32 (tokens on
lanes, as in the pool), are DMA'd beside the data into ``[2, PPB, 2, Hkv,
page_size]``. They are applied where their layout already fits, as a
``[1, BK]`` row over the key axis: the K scale multiplies the logits
(``q.(k*s) = (q.k)*s``) and the V scale the probabilities before ``P.V``
(``sum_c p_c s_c v_c``), so the raw int8/fp8 values (exact in bf16) go
through the MXU and no lane-to-sublane transpose is needed. The row of a
block is the concatenation of its pages' rows along lanes.

Per head: logits ``q_h [M, D] x k^T`` (f32 accumulation), soft cap, a mask
from iotas (context, causal, window, valid rows; per-row query offsets come
in as a constant ``[M, 1]`` input, so no vector integer division in the
kernel), online softmax with ``m``, ``l``, ``acc`` in VMEM scratch. V rows
(and V scales) past the context are zeroed so NaN garbage in unused pages
never reaches the output.

VMEM headroom: the two-slot K/V buffer gets at most 8 MiB and the kernel asks
for a 64 MiB scoped limit (v5e and v6e have 128 MiB per core); libtpu
compiles every checked variant under 80% of that limit
(kernels_pallas/pallas/tpu_compile.py), one program per TensorCore at a time.

Native limits (checked, ValueError): ``head_dim`` a multiple of 128 or
exactly 64 (lane tiles; 64 runs at half lane use, no padding copy of the
cache); ``page_size`` a multiple of 8 (whole f32 sublane tiles, so the
``[PPB, page_size, D]`` fold is tile-aligned); quantized pools with
``page_size`` not a multiple of 128 use one page per block (the scale rows
of several pages would be joined at lane offsets that are not multiples of
128). Interpret mode accepts any sizes. Not done on TPU (one or two
TensorCores per chip, a sequential grid): splitting a long context over
programs. Unverified on a real TPU (only lowered to Mosaic MLIR on CPU):
the Mosaic compiler's acceptance of the fold for packed dtypes and of the
lane concatenation of scale rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pagedjax.kernels_pallas.reference import check_args
from pagedjax.kernels_pallas.tiling import tile_table

_NEG = -1e30
_VMEM_KV_BUDGET = 8 << 20  # both slots of the K/V block buffer
_LANES = 128
_F32_SUBLANES = 8


def interpret_params():
    """The TPU interpreter's params object (renamed across JAX versions)."""
    cls = getattr(pltpu, "InterpretParams", None) or getattr(pltpu, "TPUInterpretParams")
    return cls()


def _compiler_params(vmem_limit_bytes: int):
    cls = getattr(pltpu, "CompilerParams", None) or getattr(pltpu, "TPUCompilerParams")
    return cls(dimension_semantics=("parallel",), vmem_limit_bytes=vmem_limit_bytes)


def _sublane_rows(dtype) -> int:
    """Rows of one (sublane, lane) tile of ``dtype``: 8 f32, 16 bf16, 32 int8/fp8."""
    return 8 * (4 // jnp.dtype(dtype).itemsize)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def plan(t, s, hq, hkv, d, page_size, pages_per_seq, kv_itemsize, max_q_len,
         block_q=None, pages_per_block=None, *, quantized=False, native=False):
    """Static block sizes: (BQ, M, PPB, num_tiles).

    Natively, a quantized pool whose ``page_size`` is not a multiple of 128
    gets one page per block (see the module docstring); asking for more
    raises ValueError.
    """
    g = hq // hkv
    if block_q is None:
        bound = t if max_q_len is None else min(max_q_len, t)
        block_q = 1 if bound <= 1 else max(1, min(bound, 128 // g))
    m_rows = _round_up(block_q * g, 16)
    num_tiles = t if block_q == 1 else min(t, -(-t // block_q) + s)
    num_tiles = max(num_tiles, 1)
    one_page = native and quantized and page_size % _LANES != 0
    if pages_per_block is None:
        page_bytes = 2 * hkv * page_size * d * kv_itemsize
        pages_per_block = max(1, min(512 // page_size, _VMEM_KV_BUDGET // (2 * page_bytes)))
        if one_page:
            pages_per_block = 1
    elif one_page and pages_per_block > 1:
        raise ValueError(
            f"pages_per_block: a quantized pool with page_size {page_size} (not a multiple "
            f"of {_LANES}) takes 1 page per block on TPU, got {pages_per_block}")
    pages_per_block = max(1, min(pages_per_block, pages_per_seq))
    return block_q, m_rows, pages_per_block, num_tiles


def _kernel(
    # scalar prefetch
    nrows_ref, pos0_ref, kvlen_ref, seq_ref, pt_ref,
    # inputs
    roff_ref, q_ref, kv_hbm, *rest,
    quantized: bool, hkv: int, page_size: int, pages_per_seq: int, ppb: int,
    sm_scale: float, soft_cap, window, compute_dtype,
):
    if quantized:
        sc_hbm, o_ref, kv_buf, sc_buf, sems, sc_sems, acc_ref, m_ref, l_ref = rest
    else:
        o_ref, kv_buf, sems, acc_ref, m_ref, l_ref = rest
        sc_hbm = sc_buf = sc_sems = None
    t = pl.program_id(0)
    bk = ppb * page_size
    d = kv_buf.shape[-1]
    m_rows = q_ref.shape[-2]
    # Fold [PPB, page_size, D] -> [BK, D] in the pool dtype only when every
    # page is whole packed tiles; else (and for int8/fp8, which are cast
    # through f32 anyway) widen to f32 first.
    fold_native = (not quantized) and page_size % _sublane_rows(kv_buf.dtype) == 0

    nrows = nrows_ref[t]
    pos0 = pos0_ref[t]
    kv_len = kvlen_ref[t]
    seq = seq_ref[t]
    hi = jnp.minimum(jnp.minimum(kv_len, pos0 + nrows), pages_per_seq * page_size)
    lo = 0 if window is None else jnp.maximum(pos0 - window + 1, 0)
    b_lo = lo // bk
    b_hi = jnp.where(nrows > 0, (hi + bk - 1) // bk, b_lo)
    nblk = jnp.maximum(b_hi - b_lo, 0)
    last_page = (hi + page_size - 1) // page_size  # pages [0, last_page) hold keys

    def copies(b, slot):
        out = []
        for j in range(ppb):
            idx = b * ppb + j
            pid = jnp.where(idx < last_page,
                            pt_ref[seq * pages_per_seq + jnp.minimum(idx, pages_per_seq - 1)], 0)
            # One page = K and V of all heads, contiguous in HBM and in VMEM.
            out.append(pltpu.make_async_copy(kv_hbm.at[pid], kv_buf.at[slot, j], sems.at[slot]))
            if quantized:
                out.append(pltpu.make_async_copy(sc_hbm.at[pid], sc_buf.at[slot, j],
                                                 sc_sems.at[slot]))
        return out

    def load(slot, kv, h):
        """K (kv=0) or V (kv=1) of head h in the block: [BK, D]."""
        if ppb == 1:
            x = kv_buf[slot, 0, kv, h]  # [page_size, D]
        else:
            x = kv_buf[slot, :, kv, h]  # [PPB, page_size, D]
            if not fold_native:
                x = x.astype(jnp.float32)
            x = x.reshape(bk, d)
        if x.dtype != jnp.dtype(compute_dtype) and x.dtype != jnp.dtype(jnp.float32):
            x = x.astype(jnp.float32)  # no direct int8/fp8 -> bf16 cast in Mosaic
        return x.astype(compute_dtype)

    def scale_row(slot, kv, h):
        """Scales of head h in the block as a [1, BK] row (keys on lanes)."""
        rows = [sc_buf[slot, j, kv, pl.ds(h, 1), :] for j in range(ppb)]  # [1, page_size]
        return rows[0] if ppb == 1 else jnp.concatenate(rows, axis=1)

    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    m_ref[...] = jnp.full(m_ref.shape, _NEG, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    @pl.when(nblk > 0)
    def _():
        for c in copies(b_lo, 0):
            c.start()

    roff = roff_ref[...]  # [M, 1] query index of each row (huge for pad rows)
    row_ok = roff < nrows
    q_pos = pos0 + roff

    def body(i, carry):
        b = b_lo + i
        slot = i % 2

        @pl.when(i + 1 < nblk)
        def _():
            for c in copies(b + 1, 1 - slot):
                c.start()

        for c in copies(b, slot):
            c.wait()

        k_pos = b * bk + lax.broadcasted_iota(jnp.int32, (m_rows, bk), 1)
        k_ok = (k_pos < hi) & (k_pos >= lo)
        mask = k_ok & (k_pos <= q_pos) & row_ok
        if window is not None:
            mask = mask & (k_pos > q_pos - window)
        col = b * bk + lax.broadcasted_iota(jnp.int32, (bk, 1), 0)
        col_ok = (col < hi) & (col >= lo)  # [BK, 1]
        if quantized:
            lane = b * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
            lane_ok = (lane < hi) & (lane >= lo)  # [1, BK]
        for h in range(hkv):
            k = load(slot, 0, h)
            v = jnp.where(col_ok, load(slot, 1, h), jnp.zeros((), compute_dtype))
            q = q_ref[h].astype(compute_dtype)
            s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
            if quantized:
                s = s * scale_row(slot, 0, h)  # garbage columns are masked below
            s = s * sm_scale
            if soft_cap is not None:
                s = soft_cap * jnp.tanh(s / soft_cap)
            s = jnp.where(mask, s, _NEG)
            m_prev = m_ref[h]
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
            alpha = jnp.exp(m_prev - m_new)
            p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
            l_ref[h] = l_ref[h] * alpha + jnp.sum(p, axis=1, keepdims=True)
            m_ref[h] = m_new
            if quantized:
                p = p * jnp.where(lane_ok, scale_row(slot, 1, h), 0.0)
            pv = lax.dot_general(p.astype(compute_dtype), v, (((1,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
            acc_ref[h] = acc_ref[h] * alpha + pv
        return carry

    lax.fori_loop(0, nblk, body, 0)

    for h in range(hkv):
        l = l_ref[h]
        o_ref[h] = (acc_ref[h] / jnp.where(l > 0, l, 1.0)).astype(o_ref.dtype)


def _check_kernel_args(q, kv_pages, native: bool) -> None:
    _, _, _, page_size, d = kv_pages.shape
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"q: dtype must be float32 or bfloat16, got {q.dtype}")
    if jnp.dtype(kv_pages.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
                                         jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn)):
        raise ValueError(f"kv_pages: unsupported dtype {kv_pages.dtype}")
    if not native:
        return
    if d != 64 and d % _LANES:
        raise ValueError(f"head_dim: the Mosaic kernel needs 64 or a multiple of 128, got {d}")
    if page_size % _F32_SUBLANES:
        raise ValueError(
            f"page_size: must be a multiple of {_F32_SUBLANES} on TPU (a page's "
            f"[page_size, head_dim] block of one head is whole sublane tiles), got {page_size}")


def ragged_paged_attention(
    q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *,
    sm_scale: float, sliding_window: int | None = None, soft_cap: float | None = None,
    kv_scales=None, max_q_len: int | None = None, interpret=False,
    block_q: int | None = None, pages_per_block: int | None = None,
    vmem_limit_bytes: int = 64 << 20,
):
    """Mosaic-lowered ragged paged attention (contract: ``reference.py``).

    ``interpret``: False (native TPU), True (the TPU interpreter with default
    params) or an interpreter params object.
    """
    check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    native = interpret is False or interpret is None
    _check_kernel_args(q, kv_pages, native=native)
    if kv_scales is not None and jnp.dtype(kv_scales.dtype) != jnp.dtype(jnp.float32):
        raise ValueError(f"kv_scales: expected float32, got {kv_scales.dtype}")
    if sliding_window is not None and int(sliding_window) < 1:
        raise ValueError(f"sliding_window: must be >= 1, got {sliding_window}")
    if soft_cap is not None and float(soft_cap) <= 0:
        raise ValueError(f"soft_cap: must be > 0, got {soft_cap}")
    if interpret is True:
        interpret = interpret_params()
    elif interpret is None:
        interpret = False
    t, hq, d = q.shape
    _, _, hkv, page_size, _ = kv_pages.shape
    s, p = page_table.shape
    bq, m_rows, ppb, num_tiles = plan(t, s, hq, hkv, d, page_size, p,
                                      jnp.dtype(kv_pages.dtype).itemsize, max_q_len,
                                      block_q, pages_per_block,
                                      quantized=kv_scales is not None, native=native)
    return _run(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, kv_scales,
                sm_scale=float(sm_scale),
                sliding_window=None if sliding_window is None else int(sliding_window),
                soft_cap=None if soft_cap is None else float(soft_cap),
                interpret=interpret, bq=bq, m_rows=m_rows, ppb=ppb, num_tiles=num_tiles,
                vmem_limit_bytes=int(vmem_limit_bytes))


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "interpret", "bq", "m_rows", "ppb",
    "num_tiles", "vmem_limit_bytes"))
def _run(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, kv_scales, *,
         sm_scale, sliding_window, soft_cap, interpret, bq, m_rows, ppb, num_tiles,
         vmem_limit_bytes):
    t, hq, d = q.shape
    _, _, hkv, page_size, _ = kv_pages.shape
    g = hq // hkv
    s, p = page_table.shape
    num_seqs = jnp.reshape(num_seqs, ()).astype(jnp.int32)
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    tt = tile_table(cu_q_lens, kv_lens, num_seqs, bq, num_tiles)
    row0, nrows, pos0, kvlen, seq = tt.row0, tt.nrows, tt.pos0, tt.kv_len, tt.seq

    # q tiles [NT, Hkv, M, D]: row i*G + g of KV head h = query i, head h*G + g.
    qi = jnp.arange(bq, dtype=jnp.int32)
    rows = jnp.clip(row0[:, None] + qi[None, :], 0, t - 1)  # [NT, BQ]
    qt = q.reshape(t, hkv, g, d)[rows]  # [NT, BQ, Hkv, G, D]
    qt = qt.transpose(0, 2, 1, 3, 4).reshape(num_tiles, hkv, bq * g, d)
    qt = jnp.pad(qt, ((0, 0), (0, 0), (0, m_rows - bq * g), (0, 0)))
    roff = np.full((m_rows, 1), 1 << 20, np.int32)
    roff[: bq * g, 0] = np.arange(bq * g) // g
    roff = jnp.asarray(roff)

    quantized = kv_scales is not None
    compute_dtype = jnp.float32 if q.dtype == jnp.float32 else q.dtype
    kernel = functools.partial(
        _kernel, quantized=quantized, hkv=hkv, page_size=page_size, pages_per_seq=p,
        ppb=ppb, sm_scale=sm_scale, soft_cap=soft_cap, window=sliding_window,
        compute_dtype=compute_dtype)

    in_specs = [
        pl.BlockSpec((m_rows, 1), lambda i, *_: (0, 0)),
        pl.BlockSpec((None, hkv, m_rows, d), lambda i, *_: (i, 0, 0, 0)),
        pl.BlockSpec(memory_space=pl.ANY),
    ]
    scratch = [pltpu.VMEM((2, ppb, 2, hkv, page_size, d), kv_pages.dtype)]
    inputs = [roff, qt, kv_pages]
    if quantized:
        in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
        inputs.append(kv_scales)
        scratch.append(pltpu.VMEM((2, ppb, 2, hkv, page_size), jnp.float32))
    scratch.append(pltpu.SemaphoreType.DMA((2,)))
    if quantized:
        scratch.append(pltpu.SemaphoreType.DMA((2,)))
    scratch += [pltpu.VMEM((hkv, m_rows, d), jnp.float32),
                pltpu.VMEM((hkv, m_rows, 1), jnp.float32),
                pltpu.VMEM((hkv, m_rows, 1), jnp.float32)]

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(num_tiles,),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, hkv, m_rows, d), lambda i, *_: (i, 0, 0, 0)),
        scratch_shapes=scratch,
    )
    kwargs = {}
    if interpret is False:
        kwargs["compiler_params"] = _compiler_params(vmem_limit_bytes)
    out = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((num_tiles, hkv, m_rows, d), q.dtype),
        interpret=interpret,
        name=f"ragged_paged_attention_m{m_rows}_p{ppb}",
        **kwargs,
    )(nrows, pos0, kvlen, seq, page_table.astype(jnp.int32).reshape(-1), *inputs)

    out = out[:, :, : bq * g].reshape(num_tiles, hkv, bq, g, d)
    out = out.transpose(0, 2, 1, 3, 4).reshape(num_tiles * bq, hq, d)
    valid = qi[None, :] < nrows[:, None]
    dest = jnp.where(valid, row0[:, None] + qi[None, :], t).reshape(-1)
    return jnp.zeros((t, hq, d), q.dtype).at[dest].set(out, mode="drop")
