"""The pure-jnp reference against the obviously-correct numpy loop.

``make_case`` builds ragged paged-attention inputs the hard way (NaN in every
slot no sequence owns, page 0 included; permuted page tables; padded
sequences past ``num_seqs``); ``tests/kernels_pallas/test_kernels.py`` reuses it.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import jax.numpy as jnp
import pytest

from pagedjax.kernels_pallas import reference
from pagedjax.kernels_pallas.kv_write import quantize

QUANTIZED = ("int8", "fp8")
KV_DTYPES = {
    "f32": jnp.float32,
    "bf16": jnp.bfloat16,
    "f16": jnp.float16,
    "int8": jnp.int8,
    "fp8": jnp.float8_e4m3fn,
}


def make_case(
    seed: int,
    q_lens,
    kv_lens,
    *,
    num_kv_heads: int = 2,
    group: int = 1,
    head_dim: int = 16,
    page_size: int = 4,
    kv_dtype: str = "f32",
    q_dtype=jnp.float32,
    pad_seqs: int = 1,
    pad_rows: int = 2,
    extra_pages: int = 3,
    pages_per_seq: int | None = None,
):
    """Inputs for one call. Returns (args tuple, kwargs dict with kv_scales)."""
    rng = np.random.default_rng(seed)
    q_lens = list(q_lens)
    kv_lens = list(kv_lens)
    assert len(q_lens) == len(kv_lens)
    assert all(0 <= ql <= kl for ql, kl in zip(q_lens, kv_lens))
    s_valid = len(q_lens)
    s = s_valid + pad_seqs
    need = [-(-kl // page_size) for kl in kv_lens]
    p = pages_per_seq or max(1, max(need, default=1))
    num_pages = 1 + sum(need) + extra_pages  # page 0: the null page
    two_h = 2 * num_kv_heads
    vals = np.full((num_pages, page_size, two_h, head_dim), np.nan, np.float32)
    table = np.zeros((s, p), np.int32)
    ids = rng.permutation(np.arange(1, num_pages))
    nxt = 0
    for i, kl in enumerate(kv_lens):
        for j in range(need[i]):
            pid = ids[nxt]
            nxt += 1
            table[i, j] = pid
            filled = min(page_size, kl - j * page_size)
            vals[pid, :filled] = rng.standard_normal((filled, two_h, head_dim))
    # Padded sequences point at garbage pages too (they must be ignored).
    table[s_valid:] = rng.integers(0, num_pages, size=(pad_seqs, p))
    cu = np.zeros(s + 1, np.int32)
    cu[1 : s_valid + 1] = np.cumsum(q_lens)
    cu[s_valid + 1 :] = cu[s_valid]
    t = int(cu[-1]) + pad_rows
    q = rng.standard_normal((t, group * num_kv_heads, head_dim)).astype(np.float32)
    kv_lens_arr = np.zeros(s, np.int32)
    kv_lens_arr[:s_valid] = kv_lens
    kv_lens_arr[s_valid:] = rng.integers(1, p * page_size + 1, size=pad_seqs)

    # Pool layout [N, 2, Hkv, ps, D]: built token-major above, K/V interleaved.
    vals = vals.reshape(num_pages, page_size, num_kv_heads, 2, head_dim).transpose(0, 3, 2, 1, 4)
    vals = np.ascontiguousarray(vals)
    dtype = KV_DTYPES[kv_dtype]
    scales = None
    if kv_dtype in QUANTIZED:
        data, scales = quantize(jnp.asarray(np.nan_to_num(vals)), dtype)
        data = np.asarray(data.astype(jnp.float32))
        scales = np.asarray(scales)
        unused = np.isnan(vals[..., 0])
        scales = np.where(unused, np.nan, scales).astype(np.float32)  # NaN scales
        if kv_dtype == "fp8":
            data = np.where(np.isnan(vals), np.nan, data)
        else:
            data = np.where(np.isnan(vals), 127, data)
        pages = jnp.asarray(data).astype(dtype)
        scales = jnp.asarray(scales)
    else:
        pages = jnp.asarray(vals).astype(dtype)
    args = (
        jnp.asarray(q).astype(q_dtype),
        pages,
        jnp.asarray(kv_lens_arr),
        jnp.asarray(table),
        jnp.asarray(cu),
        jnp.asarray([s_valid], jnp.int32),
    )
    return args, {"kv_scales": scales}


# Jitted so a case costs one compile, not an eager dispatch per op.
ref_attention = jax.jit(
    reference.ragged_paged_attention,
    static_argnames=("sm_scale", "sliding_window", "soft_cap", "max_q_len", "q_tile", "pages_per_chunk"),
)

MIXED = dict(  # lengths 0, 1, page-1, page, page+1, long; decode rows and prefill chunks
    q_lens=[1, 0, 3, 1, 4, 1, 2],
    kv_lens=[1, 0, 3, 4, 5, 21, 9],
)


def _close(out, ref, tol):
    out = np.asarray(jnp.asarray(out).astype(jnp.float32))
    ref = np.asarray(ref, np.float32)
    assert not np.isnan(out).any(), "NaN in output"
    err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err < tol, f"relative error {err:.3g} >= {tol}"


@pytest.mark.parametrize("max_q_len", [None, 4, 2])
@pytest.mark.parametrize("group", [1, 3])
def test_reference_mixed_matches_naive(group, max_q_len):
    args, kw = make_case(0, **MIXED, group=group)
    out = ref_attention(*args, sm_scale=0.25, max_q_len=max_q_len, **kw)
    ref = reference.naive_paged_attention(*args, sm_scale=0.25, **kw)
    _close(out, ref, 1e-5)
    t_valid = int(args[4][int(args[5][0])])
    assert np.all(np.asarray(out)[t_valid:] == 0), "rows past cu_q_lens[num_seqs] must be 0"


def test_reference_decode_only_matches_naive():
    args, kw = make_case(1, [1] * 5, [1, 3, 4, 5, 17], group=4, num_kv_heads=1)
    out = ref_attention(*args, sm_scale=0.5, max_q_len=1, **kw)
    _close(out, reference.naive_paged_attention(*args, sm_scale=0.5, **kw), 1e-5)


@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("max_q_len", [None, 1])
def test_reference_long_work_lists_match_naive(max_q_len, window):
    """One page per work item and long contexts: hundreds of items, so a tile's
    items span several loop blocks and blocks mix items of many tiles."""
    q_lens = [1, 1, 1, 1, 1, 1] if max_q_len == 1 else [1, 20, 1, 7, 40, 1]
    kv_lens = [1, 37, 100, 64, 45, 130]
    args, kw = make_case(7, q_lens, kv_lens, group=3, page_size=4)
    for ppc in (1, 3):
        out = ref_attention(*args, sm_scale=0.3, max_q_len=max_q_len, pages_per_chunk=ppc,
                            sliding_window=window, **kw)
        ref = reference.naive_paged_attention(*args, sm_scale=0.3, sliding_window=window, **kw)
        _close(out, ref, 1e-5)


@pytest.mark.parametrize("window,cap", [(3, None), (None, 1.5), (5, 2.0)])
def test_reference_window_softcap(window, cap):
    args, kw = make_case(2, **MIXED, group=2)
    f = dict(sm_scale=0.3, sliding_window=window, soft_cap=cap)
    out = ref_attention(*args, **f, **kw)
    _close(out, reference.naive_paged_attention(*args, **f, **kw), 1e-5)


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "fp8"])
def test_reference_kv_dtypes(kv_dtype):
    args, kw = make_case(3, **MIXED, group=2, kv_dtype=kv_dtype)
    out = ref_attention(*args, sm_scale=0.25, **kw)
    _close(out, reference.naive_paged_attention(*args, sm_scale=0.25, **kw), 1e-5)


def _bad(arg):
    args, kw = make_case(4, [1, 2], [3, 4], group=2)
    q, pages, kv_lens, table, cu, n = args
    return dict(q=q, kv_pages=pages, kv_lens=kv_lens, page_table=table, cu_q_lens=cu,
                kv_scales=None)


@pytest.mark.parametrize(
    "name,change",
    [
        ("q", lambda a: a.update(q=a["q"][0])),
        ("kv_pages", lambda a: a.update(kv_pages=a["kv_pages"][..., :8])),
        ("kv_pages", lambda a: a.update(kv_pages=a["kv_pages"][:, 0])),
        ("q", lambda a: a.update(q=a["q"][:, :3])),
        ("kv_lens", lambda a: a.update(kv_lens=a["kv_lens"][:, None])),
        ("page_table", lambda a: a.update(page_table=a["page_table"][:2])),
        ("cu_q_lens", lambda a: a.update(cu_q_lens=a["cu_q_lens"][:-1])),
        ("kv_lens", lambda a: a.update(kv_lens=a["kv_lens"].astype(jnp.float32))),
        ("kv_scales", lambda a: a.update(kv_pages=a["kv_pages"].astype(jnp.int8))),
        ("kv_scales", lambda a: a.update(kv_scales=jnp.ones((1, 2, 3)))),
    ],
)
def test_check_args_names_argument(name, change):
    a = _bad(name)
    change(a)
    with pytest.raises(ValueError, match=name):
        reference.check_args(a["q"], a["kv_pages"], a["kv_lens"], a["page_table"],
                             a["cu_q_lens"], a["kv_scales"])


@pytest.mark.parametrize("layer_axis", [False, True])
@pytest.mark.parametrize("quantized", [False, True])
def test_copy_pages(layer_axis, quantized):
    """Copy-on-write copies whole pages (data and scales), of every layer when stacked."""
    from pagedjax.kernels_pallas.kv_write import copy_pages

    rng = np.random.default_rng(0)
    shape = (6, 2, 2, 4, 8)  # [pages, 2, Hkv, page_size, D]
    if layer_axis:
        shape = (3,) + shape  # [L, pages, ...]
    pages = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
    scales = jnp.asarray(rng.random(shape[:-1]).astype(np.float32)) if quantized else None
    src, dst = jnp.array([1, 4, 0]), jnp.array([2, 5, 0])  # (0, 0): padding
    new_pages, new_scales = copy_pages(pages, scales, src, dst, layer_axis=layer_axis)
    want, got = np.asarray(pages), np.asarray(new_pages)
    ax = 1 if layer_axis else 0
    take = lambda a, i: np.take(a, i, axis=ax)  # noqa: E731
    np.testing.assert_array_equal(take(got, 2), take(want, 1))
    np.testing.assert_array_equal(take(got, 5), take(want, 4))
    for untouched in (0, 1, 3, 4):
        np.testing.assert_array_equal(take(got, untouched), take(want, untouched))
    if quantized:
        np.testing.assert_array_equal(take(np.asarray(new_scales), 2), take(np.asarray(scales), 1))
    else:
        assert new_scales is None
