"""Kernels (Pallas: Triton GPU, Mosaic TPU; C++: cpu_native) against the jnp reference.

On CPU both kernels run in interpret mode. ``PAGEDJAX_KERNEL_NATIVE=1`` runs
the kernel of the current platform natively (GPU: the Triton kernel with
``interpret=False``; TPU: the Mosaic kernel); the other one stays
interpreted. Shapes are tiny (head_dim 16 unless head dims are the point):
interpret mode compiles one kernel per static configuration, which is what
the time goes into, so cases share shapes where they can. The C++ kernel
(``cpu``) runs natively wherever the tests run: it must build here.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pagedjax.kernels_pallas as kernels_pallas
from pagedjax.kernels_pallas.cpu import native as cpu_native
from pagedjax.kernels_pallas.pallas import mosaic_tpu
from pagedjax.kernels_pallas import reference
from pagedjax.kernels_pallas.pallas import triton_gpu
from tests.kernels_pallas.test_reference import MIXED, make_case, ref_attention

NATIVE = os.environ.get("PAGEDJAX_KERNEL_NATIVE") == "1"
PLATFORM = jax.default_backend()
KERNELS = ("gpu", "tpu", "cpu")
# The dispatcher's cpu_native backend exists on the CPU platform only.
CPU_NATIVE = pytest.param("cpu_native", marks=pytest.mark.skipif(
    PLATFORM != "cpu", reason="attention_backend='cpu_native' is CPU-platform only"))
_TUNING = ("kv_splits", "block_k", "block_q", "pages_per_block")  # Pallas-only knobs

# Relative L2 error allowed against the f32 reference on the same inputs.
# f32: exact arithmetic up to summation order (native GPU uses ieee f32 dots).
# bf16 / int8 / fp8 caches run with bf16 queries: the probabilities enter the
# P.V product in bf16 (8 mantissa bits), ~4e-3 relative per element.
TOL = {"f32": 2e-5, "bf16": 2e-2, "int8": 2e-2, "fp8": 2e-2}


def _interpret(kind: str):
    if not NATIVE:
        return True
    return not ((kind == "gpu" and PLATFORM == "gpu") or (kind == "tpu" and PLATFORM == "tpu"))


def run(kind, args, kw, **extra):
    if kind == "cpu":  # on the CPU device even where the default platform is a GPU/TPU
        extra = {k: v for k, v in extra.items() if k not in _TUNING}
        cpu = jax.devices("cpu")[0]
        args, kw = jax.device_put((args, kw), cpu)
        with jax.default_device(cpu):
            return cpu_native.ragged_paged_attention(*args, **kw, **extra)
    fn = triton_gpu if kind == "gpu" else mosaic_tpu
    return fn.ragged_paged_attention(*args, interpret=_interpret(kind), **kw, **extra)


def check(kind, args, kw, tol=TOL["f32"], **extra):
    """Kernel vs reference; also: every row written, padding rows zero."""
    attn = {k: extra.pop(k) for k in ("sm_scale", "sliding_window", "soft_cap", "max_q_len")
            if k in extra}
    attn.setdefault("sm_scale", 0.25)
    out = run(kind, args, kw, **attn, **extra)
    ref = ref_attention(*args, **attn, **kw)
    out = np.asarray(jnp.asarray(out).astype(jnp.float32))
    ref = np.asarray(jnp.asarray(ref).astype(jnp.float32))
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert not np.isnan(out).any(), "NaN in kernel output (stray read of an unused page?)"
    err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err < tol, f"{kind}: relative error {err:.3g} >= {tol}"
    t_valid = int(args[4][int(args[5][0])])
    assert np.all(out[t_valid:] == 0), "rows past cu_q_lens[num_seqs] must be zero"
    return out


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize(
    "kind,extra",
    [
        ("gpu", {}),  # auto kv splits (the dispatcher test reuses this compile)
        ("gpu", {"kv_splits": 3, "block_k": 16, "block_q": 2}),
        ("tpu", {}),
        ("tpu", {"pages_per_block": 2, "block_q": 2}),
        ("cpu", {}),
    ],
)
def test_mixed_batch_smollm2_heads(kind, extra):
    """Lengths 0/1/page-1/page/page+1/long, prefill + decode, NaN pages, 9/3 heads."""
    args, kw = make_case(10, **MIXED, num_kv_heads=3, group=3)
    check(kind, args, kw, **extra)
    # Same compiled kernel, fresh values: permuted tables and garbage differ.
    args, kw = make_case(11, **MIXED, num_kv_heads=3, group=3)
    check(kind, args, kw, **extra)


@pytest.mark.parametrize("kind", KERNELS)
def test_sliding_window_and_soft_cap_mixed(kind):
    args, kw = make_case(30, **MIXED, num_kv_heads=1, group=4)
    check(kind, args, kw, sliding_window=3, soft_cap=1.5, sm_scale=0.5)


@pytest.mark.parametrize("kind", KERNELS)
def test_sliding_window_decode_long(kind):
    """Decode rows whose window starts past block 0 (the loop skips blocks)."""
    args, kw = make_case(31, [1] * 4, [1, 4, 37, 22], num_kv_heads=1, group=2, pages_per_seq=10)
    extra = {"kv_splits": 2, "block_k": 16} if kind == "gpu" else {"pages_per_block": 2}
    extra = {} if kind == "cpu" else extra
    check(kind, args, kw, sliding_window=6, max_q_len=1, **extra)


@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "fp8"])
def test_kv_dtypes(kind, kv_dtype):
    args, kw = make_case(40, **MIXED, num_kv_heads=2, group=2, kv_dtype=kv_dtype,
                         q_dtype=jnp.bfloat16)
    check(kind, args, kw, tol=TOL[kv_dtype])


@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize(
    "head_dim,hkv,group",  # also the GQA ratios 1, 8 and 4 (Gemma3 270m: 4 q / 1 kv, 256)
    [(64, 2, 1), (128, 1, 8), (256, 1, 4)],
)
def test_head_dims_and_gqa(kind, head_dim, hkv, group):
    """Page size 8; GQA ratio 3 is the mixed-batch test, 2 the dtype tests."""
    args, kw = make_case(50, [1, 3, 1], [9, 3, 2], num_kv_heads=hkv, group=group,
                         head_dim=head_dim, page_size=8)
    check(kind, args, kw, sm_scale=head_dim ** -0.5)


@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize("page_size,kv_lens", [(128, [127, 128, 129, 3])])
def test_page_sizes(kind, page_size, kv_lens):
    """128-token pages (4 elsewhere, 8 in the head-dim tests, 16 in lowering)."""
    args, kw = make_case(60, [1, 2, 3, 1], kv_lens, num_kv_heads=1, group=2,
                         page_size=page_size, extra_pages=1)
    check(kind, args, kw)


def test_gpu_flash_decoding_splits_agree():
    """A few long decode sequences: 1 split and many splits give the same rows."""
    args, kw = make_case(70, [1, 1, 1], [61, 40, 2], num_kv_heads=2, group=2)
    one = check("gpu", args, kw, max_q_len=1, kv_splits=1, block_k=16)
    auto = triton_gpu.plan(args[0].shape[0], 4, 4, 2, 16, 4, args[3].shape[1], 1, block_k=16)[-1]
    assert auto > 1, "decode of 3 sequences must be split across programs"
    many = check("gpu", args, kw, max_q_len=1, block_k=16)
    np.testing.assert_allclose(one, many, rtol=1e-5, atol=1e-6)


def test_gpu_step_table_variant_halves_the_key_block_and_matches_reference():
    """A variant of triton_plan.HALF_BLOCK (decode, head size 64, GQA 2, bf16 pages of 64
    tokens, several KV splits) runs with 32-key blocks: two chunks per page."""
    kv_lens = [150, 64, 7]
    args, kw = make_case(71, [1, 1, 1], kv_lens, num_kv_heads=2, group=2, head_dim=64,
                         page_size=64, kv_dtype="bf16", q_dtype=jnp.bfloat16)
    t, p = args[0].shape[0], args[3].shape[1]
    geometry = dict(t=t, s=4, hq=4, hkv=2, d=64, page_size=64, pages_per_seq=p, max_q_len=1,
                    kv_splits=4)
    assert triton_gpu.plan(**geometry, page_dtype="bfloat16")[2] == 32
    assert triton_gpu.plan(**geometry, page_dtype="int8")[2] == 64
    check("gpu", args, kw, tol=TOL["bf16"], max_q_len=1, kv_splits=4)


@pytest.mark.parametrize("backend", ["xla", CPU_NATIVE, "pallas_gpu", "pallas_tpu"])
def test_dispatcher_backends(backend):
    args, kw = make_case(10, **MIXED, num_kv_heads=3, group=3)
    out = kernels_pallas.ragged_paged_attention(
        *args, sm_scale=0.25, backend=backend,
        interpret=None, **kw)
    ref = ref_attention(*args, sm_scale=0.25, **kw)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)


def test_matches_jax_gpu_paged_attention_decode():
    """Decode vs JAX's own Pallas GPU paged-attention kernel (a peer, not product code).

    Its layout is [Hkv, N, page_size, D] per K and V, q pre-scaled. It reads
    whole pages up to the length and masks only the logits, so a NaN in V in
    the unused slots of a sequence's last page (or, with
    ``pages_per_compute_block > 1``, in the padding page 0 of a partly used
    block) turns its output NaN: here the used pages are made finite and it
    reads one page per step; page 0 and unused pages stay NaN.
    """
    from jax.experimental.pallas.ops.gpu import paged_attention as jax_pa

    hkv, group, d, ps = 2, 8, 16, 4
    args, kw = make_case(80, [1, 1, 1, 1], [5, 16, 1, 11], num_kv_heads=hkv, group=group,
                         head_dim=d, page_size=ps, pad_seqs=0, pad_rows=0)
    q, pages, kv_lens, table, cu, n = args
    valid_pages = np.unique(np.asarray(table)[np.asarray(table) > 0])
    pages_np = np.array(pages)
    pages_np[valid_pages] = np.nan_to_num(pages_np[valid_pages])
    pages = jnp.asarray(pages_np)
    args = (q, pages, kv_lens, table, cu, n)
    sm = d ** -0.5
    ours = run("gpu", args, kw, sm_scale=sm, max_q_len=1)
    k_pages = jnp.transpose(pages[:, 0], (1, 0, 2, 3))  # [Hkv, N, ps, D]
    v_pages = jnp.transpose(pages[:, 1], (1, 0, 2, 3))
    theirs = jax_pa.paged_attention(
        q * sm, k_pages, v_pages, table, kv_lens, block_h=16, pages_per_compute_block=1,
        k_splits=2, interpret=_interpret("gpu"))
    ref = ref_attention(*args, sm_scale=sm, max_q_len=1)
    np.testing.assert_allclose(np.asarray(theirs), np.asarray(ref), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------- native lowering on CPU
# Pallas lowers to Triton IR / Mosaic MLIR in Python, without the chip: these
# catch unsupported ops, non-power-of-two Triton blocks and bad ref indexing
# that interpret mode cannot. (The Triton and Mosaic compilers themselves run
# only on the device.)

LOWER_CASES = [  # (q dtype, kv dtype, head_dim, hkv, group, max_q_len, window, cap)
    (jnp.bfloat16, "bf16", 128, 2, 4, 1, None, None),
    (jnp.bfloat16, "bf16", 128, 2, 4, None, 64, 30.0),
    (jnp.float32, "f32", 64, 4, 1, None, None, None),
    (jnp.bfloat16, "int8", 256, 1, 4, None, 512, None),
    (jnp.bfloat16, "fp8", 128, 3, 3, 1, None, None),
]


def _lower(mod, platform, case):
    qd, kvd, d, hkv, g, mq, win, cap = case
    t, s, p, n, ps = 8, 4, 8, 64, 16
    from tests.kernels_pallas.test_reference import KV_DTYPES, QUANTIZED

    q = jax.ShapeDtypeStruct((t, hkv * g, d), qd)
    kv = jax.ShapeDtypeStruct((n, 2, hkv, ps, d), KV_DTYPES[kvd])
    sc = jax.ShapeDtypeStruct((n, 2, hkv, ps), jnp.float32) if kvd in QUANTIZED else None
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)

    def f(q, kv, kl, pt, cu, ns, sc):
        return mod.ragged_paged_attention(q, kv, kl, pt, cu, ns, sm_scale=0.1, kv_scales=sc,
                                          sliding_window=win, soft_cap=cap, max_q_len=mq,
                                          interpret=False)

    text = jax.jit(f).trace(q, kv, i32(s), i32(s, p), i32(s + 1), i32(1), sc).lower(
        lowering_platforms=(platform,)).as_text()
    assert "ragged_paged_attention" in text or "custom_call" in text


@pytest.mark.parametrize("case", LOWER_CASES, ids=lambda c: f"{c[1]}-d{c[2]}-g{c[4]}-q{c[5]}")
def test_triton_lowers_for_cuda(case):
    _lower(triton_gpu, "cuda", case)


@pytest.mark.parametrize("case", LOWER_CASES, ids=lambda c: f"{c[1]}-d{c[2]}-g{c[4]}-q{c[5]}")
def test_mosaic_lowers_for_tpu(case, monkeypatch):
    if PLATFORM != "tpu":
        # Lowering asks for the chip's generation; pretend to be a v5e.
        try:
            from jax._src.pallas.mosaic import tpu_info
        except ImportError as e:  # pragma: no cover
            pytest.skip(f"cannot fake a TPU for lowering in this JAX: {e}")
        if not hasattr(tpu_info, "get_device_kind"):  # pragma: no cover
            pytest.skip("cannot fake a TPU for lowering: tpu_info.get_device_kind is gone")
        monkeypatch.setattr(tpu_info, "get_device_kind", lambda: "TPU v5 lite")
        if hasattr(tpu_info, "get_num_device_cores"):
            monkeypatch.setattr(tpu_info, "get_num_device_cores", lambda: 1)
        if hasattr(tpu_info.get_tpu_info, "cache_clear"):
            tpu_info.get_tpu_info.cache_clear()
    try:
        _lower(mosaic_tpu, "tpu", case)
    finally:
        if PLATFORM != "tpu" and hasattr(tpu_info.get_tpu_info, "cache_clear"):
            tpu_info.get_tpu_info.cache_clear()


# ------------------------------------------------------------ bad arguments


def _args():
    return make_case(90, [1, 2], [3, 4], num_kv_heads=2, group=2)


@pytest.mark.parametrize("kind", ["xla", CPU_NATIVE, "pallas_gpu", "pallas_tpu"])
@pytest.mark.parametrize(
    "name,change",
    [
        ("q", lambda a: (a[0][:, :3],) + a[1:]),  # 3 q heads, 2 kv heads
        ("kv_pages", lambda a: (a[0], a[1][..., :8]) + a[2:]),  # head_dim mismatch
        ("page_table", lambda a: a[:3] + (a[3][:1],) + a[4:]),
        ("cu_q_lens", lambda a: a[:4] + (a[4][:-1],) + a[5:]),
        ("kv_lens", lambda a: (a[0], a[1], a[2].astype(jnp.float32)) + a[3:]),
    ],
)
def test_bad_arguments_name_the_argument(kind, name, change):
    args, kw = _args()
    with pytest.raises(ValueError, match=name):
        kernels_pallas.ragged_paged_attention(*change(args), sm_scale=1.0, backend=kind, **kw)


@pytest.mark.parametrize("kind", [CPU_NATIVE, "pallas_gpu", "pallas_tpu"])
def test_quantized_pages_need_scales(kind):
    args, _ = _args()
    args = (args[0], args[1].astype(jnp.int8)) + args[2:]
    with pytest.raises(ValueError, match="kv_scales"):
        kernels_pallas.ragged_paged_attention(*args, sm_scale=1.0, backend=kind)


def test_triton_unsupported_sizes():
    args, kw = _args()  # head_dim 16, page_size 4, 2 kv heads
    # head_dim must be a power of two (any mode) and >= 16 natively.
    q24 = jnp.zeros(args[0].shape[:2] + (24,))
    kv24 = jnp.zeros(args[1].shape[:4] + (24,))
    with pytest.raises(ValueError, match="head_dim"):
        triton_gpu.ragged_paged_attention(q24, kv24, *args[2:], sm_scale=1.0, interpret=True)
    q8, kv8 = args[0][..., :8], args[1][..., :8]
    with pytest.raises(ValueError, match="head_dim"):
        triton_gpu.ragged_paged_attention(q8, kv8, *args[2:], sm_scale=1.0, interpret=False)


def test_mosaic_unsupported_sizes():
    args, kw = _args()  # head_dim 16, page_size 4, 2 kv heads
    # Natively: head_dim 64 or a multiple of 128; page rows tile-aligned.
    with pytest.raises(ValueError, match="head_dim"):
        mosaic_tpu.ragged_paged_attention(*args, sm_scale=1.0, interpret=False)
    q64 = jnp.zeros(args[0].shape[:2] + (64,), jnp.bfloat16)
    kv64 = jnp.zeros((args[1].shape[0], 2, 2, 4, 64), jnp.bfloat16)  # page_size 4: not a multiple of 8
    with pytest.raises(ValueError, match="page_size"):
        mosaic_tpu.ragged_paged_attention(q64[:, :2], kv64, *args[2:], sm_scale=1.0,
                                          interpret=False)


@pytest.mark.parametrize("mod", [triton_gpu, mosaic_tpu, cpu_native],
                         ids=["triton", "mosaic", "cpu"])
def test_bad_window_cap_and_scales(mod):
    args, kw = _args()
    if mod is cpu_native:  # no interpret mode
        mod = type("M", (), {"ragged_paged_attention": staticmethod(
            lambda *a, interpret, **k: cpu_native.ragged_paged_attention(*a, **k))})
    # Window and cap must be positive; scales must be f32.
    with pytest.raises(ValueError, match="sliding_window"):
        mod.ragged_paged_attention(*args, sm_scale=1.0, sliding_window=0, interpret=True)
    with pytest.raises(ValueError, match="soft_cap"):
        mod.ragged_paged_attention(*args, sm_scale=1.0, soft_cap=-1.0, interpret=True)
    int8 = args[1].astype(jnp.int8)
    bad = jnp.ones(int8.shape[:4], jnp.bfloat16)
    with pytest.raises(ValueError, match="kv_scales"):
        mod.ragged_paged_attention(args[0], int8, *args[2:], sm_scale=1.0, kv_scales=bad,
                                   interpret=True)


@pytest.mark.parametrize("kind", ["xla", CPU_NATIVE, "pallas_gpu", "pallas_tpu"])
def test_page_table_too_narrow(kind):
    args, kw = _args()  # page_size 4, page_table [3, 1]
    kv_lens = args[2].at[0].set(args[3].shape[1] * 4 + 1)
    with pytest.raises(ValueError, match="page_table"):
        kernels_pallas.ragged_paged_attention(*args[:2], kv_lens, *args[3:], sm_scale=1.0,
                                              backend=kind, **kw)
    with pytest.raises(ValueError, match="page_table"):
        kernels_pallas.ragged_paged_attention(*args, sm_scale=1.0, backend=kind, max_q_len=99,
                                              **kw)


def test_unknown_backend():
    args, kw = _args()
    with pytest.raises(ValueError, match="attention_backend"):
        kernels_pallas.ragged_paged_attention(*args, sm_scale=1.0, backend="cuda", **kw)
