"""Compile every Triton kernel variant for sm_90a and sm_80 (no GPU needed).

    python benchmarks/kernel_bench/gpu_compile_check.py --set full --jobs 2 --json out.json

For each variant (kernels_pallas/pallas/gpu_variants.py) JAX lowers the
kernel for ``cuda``, the ``triton`` package compiles its Triton IR and ptxas
reports its resources (kernels_pallas/pallas/gpu_compile.py). Prints one row
per variant and arch: registers, spills, shared memory, warps, resident
blocks per SM and occupancy; exits 1 when any variant fails the check
(compile error, spill, shared memory over the SM's limit, or fewer than
``--headroom`` spare registers). fp8 pages are skipped on sm_80: the A100
has no fp8 conversion (Triton: "only supported on compute capability >= 89").
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

SETS = ("representative", "full", "mixed", "groups")


def _variants(name: str, **tune):
    from pagedjax.kernels_pallas.pallas import gpu_variants as gv

    if name == "full":
        out = gv.full_matrix()
    elif name == "mixed":  # the register-heaviest family, every head size and page dtype
        out = [gv.GpuVariant("mixed", d, 4, dt, 16, True, True, 1)
               for d in gv.HEAD_DIMS for dt in gv.PAGE_DTYPES]
    elif name == "groups":  # every GQA group x page size, decode and mixed, d128 int8
        out = [gv.GpuVariant(k, 128, g, "int8", ps, True, True, 1)
               for k in gv.KINDS for g in gv.GROUPS for ps in gv.PAGE_SIZES]
    else:
        out = gv.representative()
    tune = {k: x for k, x in tune.items() if x}
    return [dataclasses.replace(v, **tune) for v in out]


def check_one(v, archs, headroom):
    """Rows (one per arch) for variant ``v``; never raises."""
    from pagedjax.kernels_pallas.pallas import gpu_compile as gc, gpu_variants as gv

    rows = []
    try:
        fn, args = gv.call(v)
        kernels = gc.capture(fn, *args)
    except Exception as e:  # noqa: BLE001 - reported per row
        return [dict(variant=v.label, arch=a, ok=False, error=f"lowering: {e}"[:300])
                for a in archs]
    for arch in archs:
        skip = gv.unsupported(v, arch)
        if skip:
            rows.append(dict(variant=v.label, arch=arch, ok=True, skipped=skip))
            continue
        try:
            res = gc.compile_kernel(kernels[0], arch)
            row = dict(variant=v.label, **dataclasses.asdict(res), **gc.occupancy(res))
            gc.check(res, headroom)
            row["ok"] = True
        except gc.CompileCheckError as e:
            row = dict(locals().get("row") or dict(variant=v.label, arch=arch))
            row.update(ok=False, error=str(e)[:300])
        rows.append(row)
    return rows


def _fmt(r) -> str:
    if r.get("skipped"):
        return f"{r['variant']:<52} {r['arch']:<7} skipped: {r['skipped']}"
    if "registers" not in r:
        return f"{r['variant']:<52} {r['arch']:<7} FAIL {r.get('error', '')}"
    status = "ok" if r["ok"] else f"FAIL {r.get('error', '')}"
    return (f"{r['variant']:<52} {r['arch']:<7} {r['registers']:>4} {r['spill_stores']:>5} "
            f"{r['shared_bytes'] / 1024:>7.1f} {r['num_warps']:>5} {r['blocks']:>6} "
            f"{r['occupancy']:>5.0%} {r['limiter']:<9} {status}")


def main(argv=None) -> int:
    from pagedjax.kernels_pallas.pallas import gpu_compile as gc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=SETS, default="representative")
    ap.add_argument("--arch", action="append", choices=tuple(gc.ARCHS))
    ap.add_argument("--num-warps", type=int, help="override the kernel's choice")
    ap.add_argument("--num-stages", type=int, help="override the kernel's choice")
    ap.add_argument("--block-k", type=int, help="override the kernel's choice")
    ap.add_argument("--block-q", type=int, help="override the kernel's choice")
    ap.add_argument("--headroom", type=int, default=16, help="spare registers required")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    archs = tuple(a.arch or gc.ARCHS)
    variants = _variants(a.set, num_warps=a.num_warps, num_stages=a.num_stages,
                         block_k=a.block_k, block_q=a.block_q)
    t0 = time.perf_counter()
    print(f"{'variant':<52} {'arch':<7} {'regs':>4} {'spill':>5} {'smemKB':>7} {'warps':>5} "
          f"{'blk/SM':>6} {'occ':>5} {'limiter':<9} status", flush=True)
    rows = []
    with futures.ProcessPoolExecutor(a.jobs) if a.jobs > 1 else _Inline() as ex:
        for batch in ex.map(check_one, variants, [archs] * len(variants),
                            [a.headroom] * len(variants)):
            for r in batch:
                print(_fmt(r), flush=True)
            rows += batch
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(variants)} variants x {len(archs)} archs in {time.perf_counter() - t0:.0f} s: "
          f"{len(failed)} failed")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(set=a.set, archs=archs, headroom=a.headroom, rows=rows), f, indent=1)
    return 1 if failed else 0


class _Inline:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def map(fn, *its):
        return map(fn, *its)


if __name__ == "__main__":
    sys.exit(main())
