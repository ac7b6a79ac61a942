"""The C++ CPU attention kernel (kernels_pallas/cpu/native.py): build, fallbacks,
random ragged batches against the naive loop, batch invariance.

test_kernels.py runs it through the shared kernel cases (dtypes, head dims,
windows, page sizes, bad arguments) as kind ``cpu``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedjax.kernels_pallas.cpu import build as cpu_build, native as cpu_native
from pagedjax.kernels_pallas import reference
from tests.kernels_pallas.test_reference import make_case

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="cpu_native runs on the CPU platform")

attend = jax.jit(cpu_native.ragged_paged_attention,
                 static_argnames=("sm_scale", "sliding_window", "soft_cap", "max_q_len"))


def test_builds_here_and_caches():
    assert cpu_native.available(), cpu_native.unavailable_reason()
    assert cpu_native.matmul_unavailable_reason() is None  # both libraries build here
    if "avx2" in open("/proc/cpuinfo").read() and "fma" in open("/proc/cpuinfo").read():
        assert cpu_native.fast_matmul()  # -march=native took
    first = cpu_build.build()
    assert first.exists() and first.parent.parent == cpu_build.cache_dir()
    assert cpu_build.build() == first  # second call: the cached library
    matmul = cpu_build.build(source=cpu_native.MATMUL_SOURCE, name="cpu_matmul")
    assert matmul.exists() and matmul != first  # its own library


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 150)), min_size=1, max_size=4),
    group=st.sampled_from([1, 3, 8]),
    page_size=st.sampled_from([4, 16]),
    window=st.sampled_from([None, 1, 7, 70]),
    seed=st.integers(0, 2**16),
)
def test_random_ragged_batches_match_naive(seqs, group, page_size, window, seed):
    """Prompt chunks longer than a tile (64 / group rows), contexts over several
    64-key chunks, windows that start mid-chunk, empty sequences."""
    q_lens = [min(q, k) for q, k in seqs]
    kv_lens = [k for _, k in seqs]
    args, kw = make_case(seed, q_lens, kv_lens, num_kv_heads=2, group=group, head_dim=16,
                         page_size=page_size)
    out = attend(*args, sm_scale=0.3, sliding_window=window, **kw)
    ref = reference.naive_paged_attention(*args, sm_scale=0.3, sliding_window=window, **kw)
    out = np.asarray(out)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)
    t_valid = int(args[4][int(args[5][0])])
    assert np.all(out[t_valid:] == 0)


def test_a_sequence_gets_the_same_bits_alone_and_in_a_batch():
    """Each (sequence, head, tile) is one work item done by one thread in a fixed
    order, so batch composition and thread timing cannot change a row's value
    (what seeded sampling's batch invariance relies on)."""
    args, kw = make_case(5, [1, 30, 1, 1], [90, 130, 7, 200], num_kv_heads=3, group=3,
                         head_dim=64, page_size=16)
    q, kv, lens, table, cu, _ = args
    full = np.asarray(attend(*args, sm_scale=0.125, **kw))
    again = np.asarray(attend(*args, sm_scale=0.125, **kw))
    np.testing.assert_array_equal(full, again)
    # Sequence 1 alone (its 30 rows).
    alone_args = (q[1:31], kv, lens[1:2], table[1:2], jnp.asarray([0, 30], jnp.int32),
                  jnp.asarray([1], jnp.int32))
    alone = np.asarray(attend(*alone_args, sm_scale=0.125, **kw))
    np.testing.assert_array_equal(alone, full[1:31])


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("window", [None, 50])
def test_decode_batches_over_several_chunks_match_naive(kv_dtype, window):
    """Many decode rows (more work items than threads: each thread prefetches the next
    item it claimed) with contexts over several 64-key chunks and a page tail, f32
    queries, f32 pages or bf16 / f16 pages read in place, beside one prefill chunk; the
    SmolLM2 shape (3 query heads per KV head: one register group per item)."""
    kv_lens = [200, 1, 64, 65, 130, 17, 191, 128] * 3
    q_lens = [1] * 23 + [40]
    args, kw = make_case(21, q_lens, kv_lens, num_kv_heads=3, group=3, head_dim=64,
                         page_size=16, kv_dtype=kv_dtype)
    out = np.asarray(attend(*args, sm_scale=0.125, sliding_window=window, **kw))
    ref = reference.naive_paged_attention(*args, sm_scale=0.125, sliding_window=window, **kw)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)


def test_unsupported_dtypes_and_head_dims_fall_back_to_the_reference():
    args, kw = make_case(7, [1, 3], [5, 9], num_kv_heads=2, group=2, head_dim=12)
    out = attend(*args, sm_scale=0.3, **kw)  # head_dim 12: not a multiple of 8
    ref = reference.naive_paged_attention(*args, sm_scale=0.3, **kw)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)
    args, kw = make_case(7, [1, 3], [5, 9], num_kv_heads=2, group=2, q_dtype=jnp.float16)
    out = attend(*args, sm_scale=0.3, **kw)
    assert out.dtype == jnp.float16
    ref = reference.naive_paged_attention(*args, sm_scale=0.3, **kw)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=2e-2, atol=2e-3)


def _fresh_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **env}, timeout=300)


def test_without_the_kernel_auto_picks_xla_and_explicit_names_the_reason(tmp_path):
    code = (
        "import kernels_pallas as k\n"
        "print('auto', k.resolve_backend('auto'))\n"
        "try:\n"
        "    k.resolve_backend('cpu_native')\n"
        "except ValueError as e:\n"
        "    print('error', e)\n"
    )
    r = _fresh_python(code, PAGEDJAX_CPU_NATIVE="0")
    assert r.returncode == 0, r.stderr
    assert "auto xla" in r.stdout
    assert "error attention_backend='cpu_native' is unavailable" in r.stdout
    assert "PAGEDJAX_CPU_NATIVE=0" in r.stdout
    # A compiler that fails: same fallback, the reason quotes the build.
    r = _fresh_python(code, CXX="false", PAGEDJAX_CACHE_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "auto xla" in r.stdout and "building the C++ CPU kernels failed" in r.stdout


# ------------------------------------------------------------------- matmul

mm = jax.jit(cpu_native.matmul, static_argnames=("transposed",))


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 576, 960), (3, 40, 37), (7, 300, 130), (16, 256, 64),
                                   (13, 12, 5), (2, 1, 16), (40, 600, 200)])
def test_matmul_matches_numpy(m, k, n, transposed):
    """Few rows (K parts, 8-row passes) and more than 8 (packed blocks of 256 x 64,
    several K blocks), column and row tails past the 16/4 tiles, K not a
    multiple of 8 (the transposed kernel's scalar path)."""
    rng = np.random.default_rng(m * 1000 + k + n)
    x = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((n, k) if transposed else (k, n), np.float32)
    out = np.asarray(mm(jnp.asarray(x), jnp.asarray(w), transposed=transposed))
    ref = x.astype(np.float64) @ (w.T if transposed else w).astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_matmul_rows_do_not_depend_on_the_batch():
    """Within each path (<= 8 rows, > 8 rows) a row's bits do not depend on the others."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((30, 576), np.float32))
    w = jnp.asarray(rng.standard_normal((576, 1536), np.float32))
    few = np.asarray(mm(x[:8], w))
    for lo, hi in ((0, 1), (2, 5), (7, 8)):
        np.testing.assert_array_equal(np.asarray(mm(x[lo:hi], w)), few[lo:hi])
    many = np.asarray(mm(x, w))
    for lo, hi in ((0, 9), (5, 20), (17, 30)):
        np.testing.assert_array_equal(np.asarray(mm(x[lo:hi], w)), many[lo:hi])


def test_model_steps_use_the_native_matmul_only_for_few_rows():
    """The execution plan routes matmuls of <= native_matmul_rows rows to the custom call."""
    from pagedjax.models import layers as L
    from pagedjax.models.base import ExecutionPlan

    x16 = jnp.ones((16, 64), jnp.float32)
    x17 = jnp.ones((17, 64), jnp.float32)
    w = jnp.ones((64, 2, 8), jnp.float32)

    def hlo(x, rows=16):
        plan = ExecutionPlan(attn_backend="cpu_native", native_matmul_rows=rows)
        return jax.jit(lambda a, b: L.matmul(a, b, plan)).lower(x, w).as_text()

    assert cpu_native.MATMUL_TARGET in hlo(x16)
    assert cpu_native.MATMUL_TARGET not in hlo(x17)
    assert cpu_native.MATMUL_TARGET not in hlo(x16, rows=0)
    y = L.matmul(x16, w, ExecutionPlan(attn_backend="cpu_native", native_matmul_rows=16))
    assert y.shape == (16, 2, 8) and np.all(np.asarray(y) == 64.0)


# ------------------------------------------------------------- build paths
def _flag_id(flags):
    return " ".join(flags[1:]) or "portable"


def build_path(source, name: str, flags: list[str]):
    """The library built with exactly ``flags`` (cached), or skip naming why it cannot run here."""
    import ctypes

    try:
        so = cpu_build.build(source=source, name=name, flag_sets=[flags])
    except RuntimeError as e:
        pytest.skip(f"path {_flag_id(flags)!r} cannot run on this machine: {str(e)[-300:]}")
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("flags", cpu_build.default_flag_sets(), ids=_flag_id)
def test_every_build_path_matches_numpy(flags):
    """Each instruction-set path (this CPU's full set, AVX2 + FMA, portable) passes its
    self-test in a child process and matches numpy; paths this machine cannot run
    are skipped with the reason."""
    assert build_path(cpu_native.SOURCE, "cpu_kernels", flags).PagedjaxSelfTest() == 0
    lib = build_path(cpu_native.MATMUL_SOURCE, "cpu_matmul", flags)
    assert lib.PagedjaxSelfTest() == 0
    target = f"pagedjax_matmul_path_{abs(hash(tuple(flags)))}"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.PagedjaxMatmul), platform="cpu")
    rng = np.random.default_rng(0)
    for m, k, n, t in [(3, 576, 130, False), (12, 300, 70, False), (5, 64, 200, True)]:
        x = rng.standard_normal((m, k), np.float32)
        w = rng.standard_normal((n, k) if t else (k, n), np.float32)
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((m, n), jnp.float32))
        out = np.asarray(jax.jit(lambda a, b, t=t: call(a, b, transposed=np.int32(t)))(x, w))
        ref = x.astype(np.float64) @ (w.T if t else w).astype(np.float64)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_a_build_that_fails_its_self_test_is_rejected_and_remembered(tmp_path, monkeypatch):
    src = tmp_path / "bad.cc"
    src.write_text('extern "C" int PagedjaxSelfTest() { return 3; }\n')
    monkeypatch.setenv("PAGEDJAX_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match=r"self-test failed \(exit 3\)"):
        cpu_build.build(source=src, name="bad", flag_sets=[["-O0"]])
    assert list((tmp_path / "cache" / "native").glob("bad_*.rejected"))
    with pytest.raises(RuntimeError):  # remembered: not rebuilt
        cpu_build.build(source=src, name="bad", flag_sets=[["-O0"]])
    assert not list((tmp_path / "cache" / "native").glob("bad_*.so"))


def test_instruction_set_paths_give_the_same_bits():
    """The AVX-512 tile (where -march=native has it) and the AVX2 tile run the same FMA
    chains: a model's numbers do not depend on which path this machine runs."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"AVX2/AVX-512 paths are x86-64 only; this machine is {platform.machine()}")
    outs = []
    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 576), np.float32)
    w = rng.standard_normal((576, 200), np.float32)
    for flags in cpu_build.default_flag_sets()[:2]:
        lib = build_path(cpu_native.MATMUL_SOURCE, "cpu_matmul", flags)
        target = f"pagedjax_matmul_bits_{abs(hash(tuple(flags)))}"
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.PagedjaxMatmul), platform="cpu")
        outs.append([np.asarray(jax.jit(lambda a, b, m=m: jax.ffi.ffi_call(
            target, jax.ShapeDtypeStruct((m, 200), jnp.float32))(a, b, transposed=np.int32(0)))(
            x[:m], w)) for m in (3, 12)])  # <= 8 rows (K parts) and packed
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flags", cpu_build.default_flag_sets(), ids=_flag_id)
@pytest.mark.parametrize("kv_dtype", ["f32", "bf16", "f16", "int8", "fp8"])
def test_every_build_path_attends_like_the_reference(flags, kv_dtype):
    """The attention of each instruction-set path (this CPU's full set, AVX2 + FMA,
    portable), for every page dtype (the quantized ones widened a key row at a time;
    f16 pages, kv_cache_dtype="float16", with f32 queries as the engine runs them),
    against the jnp reference; paths this machine cannot run are skipped, naming why."""
    lib = build_path(cpu_native.SOURCE, "cpu_kernels", flags)
    target = f"pagedjax_attention_path_{abs(hash(tuple(flags)))}"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.PagedjaxRaggedPagedAttention),
                                platform="cpu")
    q_dtype = jnp.float32 if kv_dtype in ("f32", "f16") else jnp.bfloat16
    args, kw = make_case(7, [1, 5, 1, 3], [9, 23, 40, 3], num_kv_heads=3, group=3, head_dim=64,
                         page_size=16, kv_dtype=kv_dtype, q_dtype=q_dtype)
    q, pages, kv_lens, table, cu, ns = args
    scales = kw.get("kv_scales")
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q.shape, q.dtype))
    out = call(q, pages, scales if scales is not None else jnp.zeros((1,), jnp.float32),
               kv_lens, table, cu, jnp.reshape(ns, (1,)).astype(jnp.int32),
               sm_scale=np.float32(0.125), sliding_window=np.int32(0), soft_cap=np.float32(0),
               has_scales=np.int32(scales is not None))
    ref = reference.ragged_paged_attention(*args, sm_scale=0.125, **kw)
    out, ref = (np.asarray(jnp.asarray(x).astype(jnp.float32)) for x in (out, ref))
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < (2e-5 if q_dtype == jnp.float32 else 2e-2), f"relative error {err:.3g}"
