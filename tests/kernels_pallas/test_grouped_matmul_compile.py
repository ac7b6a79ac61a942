"""The grouped-matmul kernel: both Pallas paths against a reference in interpret
mode, then compiled for real chips without them: Triton for sm_90a / sm_80
(kernels_pallas/pallas/gpu_compile.py) and Mosaic for TPU v5e / v6e
(kernels_pallas/pallas/tpu_compile.py), at the expert shapes of Qwen3-30B-A3B,
Mixtral-8x7B and a tiny model. Each check is shown to fail on an oversized block.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.kernels_pallas.grouped_matmul import block_layout
from pagedjax.kernels_pallas.pallas import gpu_compile as gc
from pagedjax.kernels_pallas.pallas import grouped_matmul as gm
from pagedjax.kernels_pallas.pallas import grouped_matmul_variants as gmv
from pagedjax.kernels_pallas.pallas import tpu_compile as tc

VARIANTS = gmv.variants()


def _reference(xp, w, bg, block):
    blocks = np.asarray(xp, np.float64).reshape(-1, block, xp.shape[1])
    wb = np.asarray(w, np.float64)[np.asarray(bg)]
    return np.einsum("bmk,bkn->bmn", blocks, wb).reshape(-1, w.shape[2])


@pytest.mark.parametrize("backend", ["triton", "mosaic"])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-4), (jnp.bfloat16, 5e-2)])
def test_both_paths_match_the_reference_in_interpret_mode(backend, dtype, tol):
    rng = np.random.default_rng(3)
    m, g, k, n, block = 45, 5, 64, 96, 16
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    w = jnp.asarray(rng.standard_normal((g, k, n)), dtype)
    sizes = jnp.asarray([9, 0, 20, 3, 13], jnp.int32)
    xp, _, _, bg = block_layout(x, sizes, g, block)
    # bk=16: the Triton path loops over K in 4 steps; bn=32: 3 weight tiles per block.
    got = gm.block_matmul(xp, w, bg, block=block, interpret=True, backend=backend, bn=32, bk=16)
    want = _reference(xp, w, bg, block)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * 8)


def test_tiles_and_arguments_are_checked():
    assert gm.plan(2048, 1536) == (128, 64)
    assert gm.plan(32, 24) == (8, 32)  # largest powers of two dividing N and K
    xp, w = jnp.zeros((32, 64)), jnp.zeros((2, 64, 128))
    bg = jnp.zeros((2,), jnp.int32)
    with pytest.raises(ValueError, match="bn=48 must divide 128"):
        gm.block_matmul(xp, w, bg, block=16, bn=48, interpret=True)
    with pytest.raises(ValueError, match="backend must be"):
        gm.block_matmul(xp, w, bg, block=16, backend="cuda", interpret=True)
    with pytest.raises(ValueError, match="Triton dot needs block, bn and bk >= 16"):
        gm.block_matmul(jnp.zeros((16, 64)), w, bg[:2], block=8, backend="triton")


@functools.lru_cache(maxsize=None)
def _no_triton():
    return gc.triton_unavailable()


@functools.lru_cache(maxsize=None)
def _no_libtpu():
    return tc.libtpu_missing()


def _triton(v, arch):
    if _no_triton():
        pytest.skip(_no_triton())
    fn, args = gmv.call(v, "triton")
    (kernel,) = gc.capture(fn, *args)
    return gc.compile_kernel(kernel, arch)


@pytest.mark.parametrize("v", VARIANTS, ids=[v.label for v in VARIANTS])
def test_triton_compiles_for_hopper_and_ampere_with_headroom(v):
    for arch in gc.ARCHS:
        res = gc.check(_triton(v, arch), headroom_registers=16)
        assert res.spill_stores == 0 and res.registers <= 255 - 16
        assert gc.occupancy(res)["blocks"] >= 2


def test_triton_spill_check_fails_on_an_oversized_block():
    big = dataclasses.replace(VARIANTS[-1], block=256, bn=256)  # a 256 x 256 f32 accumulator
    res = _triton(big, "sm_90a")
    with pytest.raises(gc.CompileCheckError, match="spills"):
        gc.check(res)


def test_triton_shared_memory_check_fails_on_an_oversized_block():
    big = dataclasses.replace(VARIANTS[-1], bn=256, bk=256, num_stages=4)
    res = _triton(big, "sm_80")
    assert res.shared_bytes > gc.ARCHS["sm_80"].smem_per_block
    with pytest.raises(gc.CompileCheckError, match="shared memory"):
        gc.check(res)


@pytest.mark.parametrize("v", VARIANTS, ids=[v.label for v in VARIANTS])
def test_mosaic_compiles_for_v5e_and_v6e_within_80_percent_of_vmem(v):
    if _no_libtpu():
        pytest.skip(f"libtpu cannot compile here: {_no_libtpu()}")
    for chip in ("v5e", "v6e"):
        compiled = gmv.compile_tpu(v, chip, vmem_limit_bytes=gmv.HEADROOM_VMEM_LIMIT)
        assert "tpu_custom_call" in compiled.as_text()


def test_mosaic_vmem_check_fails_on_an_oversized_block():
    if _no_libtpu():
        pytest.skip(f"libtpu cannot compile here: {_no_libtpu()}")
    # Mixtral's down projection with the whole [14336, 4096] expert as one tile (112 MiB).
    big = dataclasses.replace(VARIANTS[-1], bn=VARIANTS[-1].n)
    with pytest.raises(Exception, match="(?i)vmem|memory|exceed"):
        gmv.compile_tpu(big, "v5e", vmem_limit_bytes=gmv.HEADROOM_VMEM_LIMIT)
