"""The Triton kernel compiled for Hopper (sm_90a) and Ampere (sm_80) without a GPU.

JAX lowers each variant for ``cuda``; the ``triton`` wheel (test extra) compiles
its Triton IR and ptxas reports registers, spills and shared memory
(kernels_pallas/pallas/gpu_compile.py). A representative subset runs here
(each variant costs a few seconds of compiler time); the full matrix is
``benchmarks/kernel_bench/gpu_compile_check.py --set full``. Each check is shown to
fail on a deliberately oversized block.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from pagedjax.kernels_pallas.pallas import gpu_compile as gc
from pagedjax.kernels_pallas.pallas import gpu_variants as gv
from pagedjax.kernels_pallas.pallas import triton_plan


@functools.lru_cache(maxsize=None)
def _unavailable():
    return gc.triton_unavailable()


@pytest.fixture(autouse=True)
def _need_triton():
    reason = _unavailable()
    if reason:
        pytest.skip(reason)


def _compile(v: gv.GpuVariant, arch: str) -> gc.KernelResources:
    fn, args = gv.call(v)
    (kernel,) = gc.capture(fn, *args)
    return gc.compile_kernel(kernel, arch)


# The heaviest variants (mixed tiles, largest heads, quantized pages, window and
# soft cap) and each value of every axis at least once, spread over both archs.
CASES = [
    (gv.GpuVariant("mixed", 256, 4, "int8", 16, True, True, 1), "sm_90a"),
    (gv.GpuVariant("mixed", 256, 4, "bfloat16", 16, True, True, 1), "sm_80"),
    (gv.GpuVariant("mixed", 128, 4, "float8_e4m3fn", 128, True, True, 1), "sm_90a"),
    (gv.GpuVariant("mixed", 128, 7, "int8", 64, False, True, 4), "sm_80"),
    (gv.GpuVariant("decode", 64, 3, "bfloat16", 16, False, False, 4), "sm_80"),
    (gv.GpuVariant("decode", 128, 8, "int8", 64, True, False, 1), "sm_80"),
    (gv.GpuVariant("decode", 256, 2, "int8", 128, False, True, 4), "sm_90a"),
    (gv.GpuVariant("mixed", 64, 1, "bfloat16", 128, True, False, 4), "sm_90a"),
]


@pytest.mark.parametrize("v,arch", CASES, ids=[f"{v.label}-{a}" for v, a in CASES])
def test_variant_compiles_without_spills_with_headroom(v, arch):
    res = gc.check(_compile(v, arch), headroom_registers=16)
    assert res.spill_stores == res.spill_loads == 0
    assert res.registers <= 255 - 16
    occ = gc.occupancy(res)
    assert occ["blocks"] >= 1 and 0 < occ["occupancy"] <= 1


# Variants that spill 4-36 B at an occupancy step on 4 warps with mixed tiles of 32 rows
# at every head size: ptxas caps their registers at 96, 128 or 168 (the most that still
# fit one more block per SM) and spills the rest. On 8 warps, with 16-row tiles above
# head size 64, none sits just above a step.
FOUR_WARP_STEP_SPILLS = [
    (gv.GpuVariant("decode", 128, 8, "float8_e4m3fn", 64, True, False, 1), "sm_90a"),
    (gv.GpuVariant("mixed", 64, 3, "bfloat16", 16, False, True, 4), "sm_90a"),
    (gv.GpuVariant("decode", 64, 1, "int8", 64, False, False, 1), "sm_80"),
    (gv.GpuVariant("mixed", 256, 2, "bfloat16", 128, False, False, 1), "sm_90a"),
    (gv.GpuVariant("mixed", 128, 8, "int8", 128, False, True, 1), "sm_80"),
]


@pytest.mark.parametrize("v,arch", FOUR_WARP_STEP_SPILLS,
                         ids=[f"{v.label}-{a}" for v, a in FOUR_WARP_STEP_SPILLS])
def test_four_warp_step_spills_compile_clean_on_8_warps(v, arch):
    res = gc.check(_compile(v, arch), headroom_registers=16)
    assert res.num_warps == 8 and res.spill_stores == 0


# The variants of the matrix run that still spilled on 8 warps, a few registers over the
# 64-, 80- or 128-register step on sm_90a: the plan halves their key block (triton_plan).
# One variant per row of the table here; `gpu_compile_check.py --set steps` compiles all.
STEP_TABLE = [next(v for v in gv.step_table() if triton_plan.matches(row, v.step_key))
              for row in triton_plan.HALF_BLOCK]


@pytest.mark.parametrize("v", STEP_TABLE, ids=[v.label for v in STEP_TABLE])
def test_step_table_variants_compile_without_spills(v):
    fn, args = gv.call(v)
    (kernel,) = gc.capture(fn, *args)
    default_k = triton_plan.default_block_k(v.head_dim, v.pages_per_seq * v.page_size)
    assert f"_k{default_k // 2}_" in kernel.name  # what the engine launches
    for arch in gc.ARCHS:
        if gv.unsupported(v, arch):
            continue
        res = gc.check(gc.compile_kernel(kernel, arch), headroom_registers=16)
        assert res.spill_stores == res.spill_loads == 0 and res.num_warps == 8
        assert gc.occupancy(res)["occupancy"] >= 0.25


def test_step_spill_with_the_default_block_is_triton_s_allocator_flag():
    """Why the table halves the block: with the default one, head size 256, fp8 pages,
    window and soft cap sit at the 128-register step on sm_90a and spill; the check fails
    it, and reports that ptxas' default allocator fits the same PTX with no spill."""
    v = gv.GpuVariant("mixed", 256, 4, "float8_e4m3fn", 16, True, True, 1, block_k=32)
    res = _compile(v, "sm_90a")
    assert res.registers == 128 and res.spill_stores > 0
    assert res.spill_stores_default_alloc == 0
    with pytest.raises(gc.CompileCheckError, match="0 B with ptxas' default allocator"):
        gc.check(res)


def test_tile_plan_keeps_every_tile_on_8_warps():
    """Mixed tiles: 32 query rows at head size 64, 16 (as decode) above; 8 warps."""
    assert gv.GpuVariant("mixed", 64, 4).plan()[:2] == (8, 32)
    assert gv.GpuVariant("mixed", 128, 4).plan()[:2] == (4, 16)
    assert gv.GpuVariant("mixed", 256, 3).plan()[:2] == (5, 16)
    assert gv.GpuVariant("decode", 256, 8).plan()[:2] == (1, 16)
    # The key block: 64 keys, 32 at head size 256, halved for the step table's variants.
    assert gv.GpuVariant("mixed", 128, 4, "bfloat16", 16, kv_splits=1).plan()[2] == 64
    assert gv.GpuVariant("mixed", 128, 4, "bfloat16", 16, kv_splits=4).plan()[2] == 32
    assert gv.GpuVariant("mixed", 256, 4, "float8_e4m3fn", 16, True, True).plan()[2] == 16
    assert gv.GpuVariant("mixed", 256, 4, "bfloat16", 16, True, True).plan()[2] == 32
    fn, args = gv.call(gv.GpuVariant("mixed", 128, 4))
    (kernel,) = gc.capture(fn, *args)
    assert kernel.num_warps == triton_plan.NUM_WARPS == 8


def test_every_axis_value_is_covered():
    """The matrix has every value of every axis; the test subset too."""
    full = gv.full_matrix()
    for axis, values in (("kind", gv.KINDS), ("head_dim", gv.HEAD_DIMS), ("group", gv.GROUPS),
                         ("page_dtype", gv.PAGE_DTYPES), ("page_size", gv.PAGE_SIZES)):
        assert {getattr(v, axis) for v in full} == set(values)
    sub = [v for v, _ in CASES]
    for axis in ("kind", "head_dim", "page_dtype", "page_size", "window", "soft_cap", "kv_splits"):
        assert {getattr(v, axis) for v in sub} == {getattr(v, axis) for v in full}, axis
    assert {a for _, a in CASES} == set(gc.ARCHS)


def test_spill_check_fails_on_an_oversized_block():
    # 64 query rows x head size 256 on 4 warps (the tile before the headroom change).
    big = gv.GpuVariant("mixed", 256, 4, "bfloat16", 16, block_q=16, num_warps=4)
    res = _compile(big, "sm_90a")
    assert res.spill_stores > 0
    with pytest.raises(gc.CompileCheckError, match="spills"):
        gc.check(res)


def test_shared_memory_check_fails_on_an_oversized_block():
    big = gv.GpuVariant("decode", 256, 1, "bfloat16", 16, block_k=256, num_stages=4)
    res = _compile(big, "sm_80")
    assert res.shared_bytes > gc.ARCHS["sm_80"].smem_per_block
    with pytest.raises(gc.CompileCheckError, match="shared memory"):
        gc.check(res)


def test_compile_error_is_reported():
    """fp8 pages on the A100: Triton cannot convert fp8 below compute capability 8.9."""
    v = gv.GpuVariant("decode", 128, 1, "float8_e4m3fn", 16)
    assert gv.unsupported(v, "sm_80")
    with pytest.raises(gc.CompileCheckError, match="failed to compile"):
        _compile(v, "sm_80")


def test_register_headroom_check_fails_near_the_limit():
    """The mixed tiles as they were before the headroom change (64 rows, 4 warps)."""
    before = gv.GpuVariant("mixed", 128, 4, "bfloat16", 16, True, True, block_q=16, num_warps=4)
    res = _compile(before, "sm_90a")
    assert res.registers > 255 - 16
    with pytest.raises(gc.CompileCheckError, match="within 16"):
        gc.check(res, headroom_registers=16)


def test_parse_ptxas_and_occupancy():
    log = ("ptxas info    : Used 168 registers, used 1 barriers, 456 bytes cmem[0]\n"
           "ptxas info    : Function properties for k\n"
           "    0 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n")
    rep = gc.parse_ptxas(log)
    assert rep == dict(registers=168, stack_bytes=0, spill_stores=12, spill_loads=8,
                       static_smem=0)
    with pytest.raises(gc.CompileCheckError, match="no resource report"):
        gc.parse_ptxas("ptxas fatal")
    res = gc.KernelResources("sm_90a", "k", 4, 2, 168, 0, 0, 0, 40960)
    occ = gc.occupancy(res)
    # 168 registers -> 5376 per warp -> 12 warps -> 3 blocks of 4 warps.
    assert occ == dict(blocks=3, limiter="registers", occupancy=12 / 64)
    big = dataclasses.replace(res, registers=64, shared_bytes=100 * 1024)
    assert gc.occupancy(big)["limiter"] == "shared"


def test_fp8_pages_are_refused_on_an_a100(monkeypatch):
    """What the sm_80 compile error means for a user: a ValueError naming kv_pages."""
    import jax.numpy as jnp

    from pagedjax.kernels_pallas.pallas import triton_gpu

    monkeypatch.setattr(triton_gpu, "compute_capability", lambda: (8, 0))
    q = jnp.zeros((1, 1, 16), jnp.bfloat16)
    kv = jnp.zeros((2, 2, 1, 16, 16), jnp.float8_e4m3fn)
    sc = jnp.ones((2, 2, 1, 16), jnp.float32)
    i = lambda *v: jnp.asarray(v, jnp.int32)  # noqa: E731
    with pytest.raises(ValueError, match="kv_pages: fp8 pages need a GPU of compute capability"):
        triton_gpu.ragged_paged_attention(q, kv, i(1), i([1]), i(0, 1), i(1), sm_scale=1.0,
                                          kv_scales=sc, interpret=False)
