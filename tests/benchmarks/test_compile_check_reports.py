"""The full-matrix compile check's reports (benchmarks/kernel_bench/gpu_compile_check.py):
the per-axis summary, the figure with every variant, and the Triton-IR cache, on
synthetic rows (no compiler needed)."""

from __future__ import annotations

import dataclasses

from benchmarks.kernel_bench import gpu_compile_check as check
from pagedjax.kernels_pallas.pallas import gpu_variants as gv


def _row(v, arch, regs, spill=0, ok=True):
    return dict(variant=v.label, axes=dataclasses.asdict(v), arch=arch, registers=regs,
                spill_stores=spill, spill_loads=spill, shared_bytes=40 * 1024, num_warps=8,
                blocks=2, occupancy=0.25, limiter="registers", ok=ok)


def test_summary_and_figure_name_the_worst_per_axis_value():
    a = gv.GpuVariant("decode", 64, 1, "int8", 16)
    b = gv.GpuVariant("mixed", 128, 4, "bfloat16", 64, True, True, 4)
    rows = [_row(a, "sm_90a", 64), _row(a, "sm_80", 80, spill=8, ok=False),
            _row(b, "sm_90a", 120), dict(variant=b.label, axes=dataclasses.asdict(b),
                                         arch="sm_80", ok=True, skipped="why")]
    lines = check.summary_lines(rows)
    kind_sm80 = next(ln for ln in lines if ln.startswith("kind        decode") and "sm_80" in ln)
    assert kind_sm80.split()[3:] == ["1", "80", "8", "40.0", "25%", "1", "?"]
    assert not any(ln.startswith("kind        mixed") and "sm_80" in ln for ln in lines)
    fig = check.figure(rows, ("sm_90a", "sm_80"), 16, 2592)
    assert fig["categories"] == ["decode d64", "mixed d128"]
    assert fig["series"][0]["values"] == [64, 120] and fig["series"][1]["values"] == [80, None]
    assert fig["failed"] == 1 and fig["compiled"] == 2 and fig["matrix"] == 2592
    assert fig["variants"][a.label]["sm_80"] == [80, 8, 40.0, 8, 2]
    assert fig["variants"][b.label]["sm_80"] == "why"
    for key in ("commands", "date", "machine", "title", "kind", "series"):
        assert fig[key]


def test_cache_compiles_identical_ir_once(monkeypatch):
    from pagedjax.kernels_pallas.pallas import gpu_compile as gc

    calls = []

    def fake_compile(kernel, arch):
        calls.append(arch)
        return gc.KernelResources(arch, kernel.name, kernel.num_warps, kernel.num_stages,
                                  96, 0, 0, 0, 1024)

    monkeypatch.setattr(gc, "compile_kernel", fake_compile)
    monkeypatch.setattr(check, "_CACHE", {})
    k = gc.TritonKernel("k", "tt.func @k() {}", 8, 2)
    first, key = check._compile_cached(k, "sm_90a")
    again, key2 = check._compile_cached(dataclasses.replace(k, name="same ir"), "sm_90a")
    check._compile_cached(dataclasses.replace(k, num_warps=4), "sm_90a")
    assert key == key2 and first == again
    assert calls == ["sm_90a", "sm_90a"]  # the 4-warp build is a different cubin


def test_a_cached_spill_without_the_allocator_recheck_is_compiled_again(monkeypatch):
    from pagedjax.kernels_pallas.pallas import gpu_compile as gc

    k = gc.TritonKernel("k", "tt.func @k() {}", 8, 2)
    old = dataclasses.asdict(gc.KernelResources("sm_90a", "k", 8, 2, 128, 16, 16, 16, 1024))
    monkeypatch.setattr(check, "_CACHE", {check._cache_key(k, "sm_90a"): old})
    monkeypatch.setattr(gc, "compile_kernel", lambda kernel, arch: gc.KernelResources(
        arch, kernel.name, 8, 2, 128, 16, 16, 16, 1024, spill_stores_default_alloc=0))
    res, _ = check._compile_cached(k, "sm_90a")
    assert res.spill_stores_default_alloc == 0
