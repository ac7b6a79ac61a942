"""One definition of the attention-variant axes (kernels_pallas/pallas/variant_axes.py)
that the GPU and TPU compile checks both read."""

from __future__ import annotations

import subprocess

import jax.numpy as jnp

from pagedjax.kernels_pallas.pallas import gpu_variants as gv
from pagedjax.kernels_pallas.pallas import tpu_compile as tc
from pagedjax.kernels_pallas.pallas import variant_axes as va
from tests.utils.paths import REPO_ROOT

AXES = {"kind": va.KINDS, "head_dim": va.HEAD_DIMS, "group": va.GROUPS,
        "page_dtype": va.PAGE_DTYPES, "page_size": va.PAGE_SIZES}


def test_gpu_matrix_is_the_whole_product_and_tpu_a_subset_of_it():
    gpu = gv.full_matrix()
    assert len(gpu) == 2 * 3 * 6 * 3 * 3 * 4 * len(gv.SPLITS)
    assert len({v.label for v in gpu}) == len(gpu)
    for axis, values in AXES.items():
        assert {getattr(v, axis) for v in gpu} == set(values), axis
    tpu = tc.full_matrix()
    for axis, values in AXES.items():
        assert {getattr(v, axis) for v in tpu} <= set(values), axis
    assert {v.head_dim for v in tpu} == set(va.HEAD_DIMS)
    assert {v.page_dtype for v in tpu} == set(va.PAGE_DTYPES)
    base = {(v.kind, v.head_dim, v.page_dtype, v.page_size, v.window, v.soft_cap) for v in gpu
            if v.group == 4}
    assert {(v.kind, v.head_dim, v.page_dtype, v.page_size, v.window, v.soft_cap)
            for v in tpu} <= base


def test_both_platforms_build_the_same_launch():
    g = gv.GpuVariant("mixed", 64, 3, "int8", 16, True, False, 4)
    t = tc.TpuVariant("mixed", 64, 3, "int8", 16, True, False)
    assert g.base_label == t.base_label == "mixed d64 g3 int8 ps16 window"
    ga, ta = g.abstract_args(), t.abstract_args()
    assert [(a.shape, a.dtype) for a in ga] == [(a.shape, a.dtype) for a in ta]
    q, kv, *_, scales = ga
    assert q.shape == (512, 6, 64) and q.dtype == jnp.bfloat16
    assert kv.shape == (16 * 64 + 1, 2, 2, 16, 64) and kv.dtype == jnp.int8
    assert scales.shape == (16 * 64 + 1, 2, 2, 16)
    kw = g.attention_kwargs()
    assert kw == dict(sm_scale=0.125, sliding_window=va.WINDOW, soft_cap=None, max_q_len=None)
    assert len(gv.GpuVariant("decode").abstract_args()) == 6  # bf16 pages: no scales


def test_device_check_script_names_its_platforms():
    proc = subprocess.run(["bash", "benchmarks/kernel_bench/device_check.sh", "cuda"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "gpu|tpu" in proc.stderr and "'cuda'" in proc.stderr
    for name, platform in (("gpu_check.sh", "gpu"), ("tpu_check.sh", "tpu")):
        text = (REPO_ROOT / "benchmarks" / "kernel_bench" / name).read_text()
        assert f'device_check.sh" {platform}' in text
