"""The grouped-matmul kernel compiled for sm_90a / sm_80 and TPU v5e / v6e (no device
needed), and its roofline, at the expert shapes of Qwen3-30B-A3B, Mixtral-8x7B and a
tiny model.

    python benchmarks/kernel_bench/grouped_matmul_check.py --json out.json

For each launch (kernels_pallas/pallas/grouped_matmul_variants.py: both
projections of each model's experts, a 64-token decode step):

1. Triton: JAX lowers the kernel for ``cuda``, the ``triton`` package compiles it
   for sm_90a and sm_80, ptxas reports registers, spills and shared memory; the
   check fails on any spill, shared memory past the SM's limit or fewer than 16
   spare registers (kernels_pallas/pallas/gpu_compile.py).
2. Mosaic: libtpu compiles it for v5e and v6e under 80% of the VMEM limit the
   kernel asks for, and the smallest scoped-VMEM limit that still compiles is
   found by bisection (the compiler's own figure of what the kernel needs).
3. Roofline: bytes and FLOPs of the launch (tokens routed evenly over the
   experts) and its time at each chip's peak; the whole MoE part of a decode step.

Exit 1 when any check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

CHIPS = ("H100", "H200", "A100", "v5e", "v6e")
LAYERS = {"tiny": 2, "Qwen3-30B-A3B": 48, "Mixtral-8x7B": 32}
TOKENS = 64


def triton_rows(v) -> list[dict]:
    from pagedjax.kernels_pallas.pallas import gpu_compile as gc
    from pagedjax.kernels_pallas.pallas import grouped_matmul_variants as gmv

    if gc.triton_unavailable():
        return [dict(variant=v.label, arch=a, ok=False, error=gc.triton_unavailable())
                for a in gc.ARCHS]
    fn, args = gmv.call(v, "triton")
    (kernel,) = gc.capture(fn, *args)
    rows = []
    for arch in gc.ARCHS:
        row = dict(variant=v.label, arch=arch)
        try:
            res = gc.compile_kernel(kernel, arch)
            row.update(**dataclasses.asdict(res), **gc.occupancy(res))
            gc.check(res, headroom_registers=16)
            row["ok"] = True
        except gc.CompileCheckError as e:
            row.update(ok=False, error=str(e)[:300])
        rows.append(row)
    return rows


def _compiles(v, chip, limit) -> bool:
    from pagedjax.kernels_pallas.pallas import grouped_matmul_variants as gmv

    try:
        gmv.compile_tpu(v, chip, vmem_limit_bytes=limit)
        return True
    except Exception:  # noqa: BLE001 - a VMEM overflow (or any error) is "no"
        return False


def mosaic_rows(v) -> list[dict]:
    from pagedjax.kernels_pallas.pallas import grouped_matmul_variants as gmv
    from pagedjax.kernels_pallas.pallas import tpu_compile as tc

    if tc.libtpu_missing():
        return [dict(variant=v.label, chip=c, ok=False, error=tc.libtpu_missing())
                for c in ("v5e", "v6e")]
    rows = []
    for chip in ("v5e", "v6e"):
        row = dict(variant=v.label, chip=chip, limit=gmv.HEADROOM_VMEM_LIMIT)
        try:
            gmv.compile_tpu(v, chip)
            row["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported per row
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        if row["ok"]:  # bisect the smallest limit that compiles, to 1/4 MiB
            lo, hi = 0, gmv.HEADROOM_VMEM_LIMIT >> 18
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if _compiles(v, chip, mid << 18) else (mid, hi)
            row["vmem_needed"] = hi << 18
        rows.append(row)
    return rows


def roofline_rows(variants) -> tuple[list[dict], list[dict]]:
    from pagedjax.kernels_pallas.pallas import grouped_matmul_variants as gmv
    from pagedjax.kernels_pallas.pallas import roofline as rl

    shapes = {s.name: s for s in gmv.SHAPES}
    rows, steps = [], {}
    for v in variants:
        s = shapes[v.model]
        cost = rl.grouped_matmul(rl.routed_rows(TOKENS, s.experts, s.top_k), v.k, v.n)
        rows.append(dict(variant=v.label, bytes=cost.bytes, flops=cost.flops,
                         **{f"{c}_us": cost.seconds(rl.CHIPS[c]) * 1e6 for c in CHIPS}))
        steps[v.model] = steps.get(v.model, rl.Cost(0.0, 0.0)) + cost.scale(LAYERS[v.model])
    step_rows = [dict(model=m, layers=LAYERS[m], tokens=TOKENS, bytes=c.bytes, flops=c.flops,
                      **{f"{ch}_ms": c.seconds(rl.CHIPS[ch]) * 1e3 for ch in CHIPS})
                 for m, c in steps.items()]
    return rows, step_rows


def _print(res) -> None:
    print(f"{'launch':<52} {'arch':<7} {'regs':>4} {'spill':>5} {'smemKB':>7} {'warps':>5} "
          f"{'blk/SM':>6} {'occ':>5} status")
    for r in res["triton"]:
        if "registers" not in r:
            print(f"{r['variant']:<52} {r['arch']:<7} FAIL {r.get('error', '')}")
            continue
        print(f"{r['variant']:<52} {r['arch']:<7} {r['registers']:>4} {r['spill_stores']:>5} "
              f"{r['shared_bytes'] / 1024:>7.1f} {r['num_warps']:>5} {r['blocks']:>6} "
              f"{r['occupancy']:>5.0%} {'ok' if r['ok'] else 'FAIL ' + r['error']}")
    print(f"\n{'launch':<52} {'chip':<4} {'VMEM needed MiB':>15} {'limit MiB':>9} status")
    for r in res["mosaic"]:
        need = f"{r['vmem_needed'] / 2**20:>15.2f}" if "vmem_needed" in r else f"{'-':>15}"
        print(f"{r['variant']:<52} {r['chip']:<4} {need} {r.get('limit', 0) / 2**20:>9.1f} "
              f"{'ok' if r['ok'] else 'FAIL ' + r['error']}")
    print(f"\nRoofline, {TOKENS}-token decode step (rows routed evenly), microseconds:")
    print(f"{'launch':<52} {'MB':>8} {'GFLOP':>7} " + " ".join(f"{c:>7}" for c in CHIPS))
    for r in res["roofline"]:
        print(f"{r['variant']:<52} {r['bytes'] / 1e6:>8.1f} {r['flops'] / 1e9:>7.2f} "
              + " ".join(f"{r[c + '_us']:>7.1f}" for c in CHIPS))
    print(f"\nAll MoE layers of a {TOKENS}-token decode step (both projections), ms:")
    print(f"{'model':<16} {'layers':>6} {'GB':>7} " + " ".join(f"{c:>7}" for c in CHIPS))
    for r in res["steps"]:
        print(f"{r['model']:<16} {r['layers']:>6} {r['bytes'] / 1e9:>7.2f} "
              + " ".join(f"{r[c + '_ms']:>7.2f}" for c in CHIPS))


def figure(res, variants, failed: int) -> dict:
    """Registers per thread of each launch on sm_90a and sm_80 (bars, with the
    headroom line); the VMEM and roofline rows ride along."""
    def regs(label, arch):
        return next((r.get("registers") for r in res["triton"]
                     if r["variant"] == label and r["arch"] == arch), None)

    return dict(
        title=f"Grouped matmul (Triton): registers per thread per expert launch; "
              f"{failed} of {len(res['triton']) + len(res['mosaic'])} compiles failed",
        kind="bars", categories=[f"{v.model.split('-')[0]} {v.proj}" for v in variants],
        series=[dict(label=arch, values=[regs(v.label, arch) for v in variants])
                for arch in ("sm_90a", "sm_80")],
        hlines=[dict(y=239, label="255 - 16: the headroom limit")],
        ylabel="registers per thread", ylim=[0, 270],
        commands=["python benchmarks/kernel_bench/grouped_matmul_check.py --json out.json "
                  "--figure fig.json"],
        date="2026-12-05",
        machine="2-core VM shared with other agents, no GPU or TPU (compile only: triton "
                "3.9.0 / ptxas and libtpu 0.0.42.1); jax 0.10.2",
        mosaic=[{k: r.get(k) for k in ("variant", "chip", "vmem_needed", "limit", "ok")}
                for r in res["mosaic"]],
        roofline=res["roofline"], steps=res["steps"])


def main(argv=None) -> int:
    from pagedjax.kernels_pallas.pallas import grouped_matmul_variants as gmv

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-tpu", action="store_true", help="skip the Mosaic compiles")
    ap.add_argument("--figure", help="write a benchmarks/plot.py figure of the results here")
    a = ap.parse_args(argv)
    variants = gmv.variants(TOKENS)
    res = dict(triton=[r for v in variants for r in triton_rows(v)],
               mosaic=[] if a.no_tpu else [r for v in variants for r in mosaic_rows(v)])
    res["roofline"], res["steps"] = roofline_rows(variants)
    _print(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    failed = [r for r in res["triton"] + res["mosaic"] if not r["ok"]]
    if a.figure:
        with open(a.figure, "w") as f:
            json.dump(figure(res, variants, len(failed)), f, indent=1)
    print(f"\n{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
