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
import hashlib
import json
import os
import random
import re
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

SETS = ("representative", "full", "mixed", "groups", "steps")


def _variants(name: str, **tune):
    from pagedjax.kernels_pallas.pallas import gpu_variants as gv, triton_plan

    if name == "full":
        out = gv.full_matrix()
    elif name == "mixed":  # the register-heaviest family, every head size and page dtype
        out = [gv.GpuVariant("mixed", d, 4, dt, 16, True, True, 1)
               for d in gv.HEAD_DIMS for dt in gv.PAGE_DTYPES]
    elif name == "groups":  # every GQA group x page size, decode and mixed, d128 int8
        out = [gv.GpuVariant(k, 128, g, "int8", ps, True, True, 1)
               for k in gv.KINDS for g in gv.GROUPS for ps in gv.PAGE_SIZES]
    elif name == "steps":  # the step table's variants (triton_plan.HALF_BLOCK)
        out = gv.step_table()
    else:
        out = gv.representative()
    if tune.pop("default_block", False):  # the default key block: no step table
        out = [dataclasses.replace(v, block_k=triton_plan.default_block_k(
            v.head_dim, v.pages_per_seq * v.page_size)) for v in out]
    tune = {k: x for k, x in tune.items() if x}
    return [dataclasses.replace(v, **tune) for v in out]


_CACHE: dict = {}  # cache key -> KernelResources as a dict, or {"error": ...}


def _init_worker(cache: dict) -> None:
    _CACHE.update(cache)


def _cache_key(kernel, arch) -> str:
    h = hashlib.sha256(kernel.ttir.encode()).hexdigest()[:24]
    return f"{h}:{kernel.num_warps}:{kernel.num_stages}:{arch}"


def _compile_cached(kernel, arch):
    """``compile_kernel`` through the cache: identical Triton IR, warps and stages
    on the same arch compile to the same cubin, so each is compiled once."""
    from pagedjax.kernels_pallas.pallas import gpu_compile as gc

    key = _cache_key(kernel, arch)
    hit = _CACHE.get(key)
    if hit is None or (hit.get("spill_stores") and
                       hit.get("spill_stores_default_alloc") is None):
        try:
            _CACHE[key] = dataclasses.asdict(gc.compile_kernel(kernel, arch))
        except gc.CompileCheckError as e:
            _CACHE[key] = dict(error=str(e)[:300])
    hit = _CACHE[key]
    if "error" in hit:
        raise gc.CompileCheckError(hit["error"])
    return gc.KernelResources(**hit), key


def check_one(v, archs, headroom):
    """(rows, cache entries): one row per arch for variant ``v``; never raises."""
    from pagedjax.kernels_pallas.pallas import gpu_compile as gc, gpu_variants as gv

    rows, used = [], {}
    base = dict(variant=v.label, axes=dataclasses.asdict(v))
    try:
        fn, args = gv.call(v)
        kernels = gc.capture(fn, *args)
    except Exception as e:  # noqa: BLE001 - reported per row
        return [dict(base, arch=a, ok=False, error=f"lowering: {e}"[:300]) for a in archs], used
    for arch in archs:
        skip = gv.unsupported(v, arch)
        if skip:
            rows.append(dict(base, arch=arch, ok=True, skipped=skip))
            continue
        row = dict(base, arch=arch)
        try:
            res, key = _compile_cached(kernels[0], arch)
            used[key] = _CACHE[key]
            row.update(**dataclasses.asdict(res), **gc.occupancy(res))
            gc.check(res, headroom)
            row["ok"] = True
        except gc.CompileCheckError as e:
            key = _cache_key(kernels[0], arch)
            used[key] = _CACHE.get(key, {})
            row.update(ok=False, error=str(e)[:300])
        rows.append(row)
    return rows, used


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
    ap.add_argument("--default-block", action="store_true",
                    help="the default key block for every variant (no step table: "
                         "kernels_pallas/pallas/triton_plan.py)")
    ap.add_argument("--headroom", type=int, default=16, help="spare registers required")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--shuffle", type=int, metavar="SEED",
                    help="run the variants in a random order (a partial run is then a sample "
                         "of every axis)")
    ap.add_argument("--limit", type=int, help="only the first N variants (after --shuffle)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--cache", help="compile results by Triton IR hash: read, then updated")
    ap.add_argument("--figure", help="write a compact per-variant table here")
    ap.add_argument("--recheck", action="store_true",
                    help="with --json: check again only that file's variants that failed or "
                         "whose key block the plan now changes, and rewrite it")
    a = ap.parse_args(argv)
    archs = tuple(a.arch or gc.ARCHS)
    variants, total, kept = _select(a)
    t0 = time.perf_counter()
    print(f"{'variant':<52} {'arch':<7} {'regs':>4} {'spill':>5} {'smemKB':>7} {'warps':>5} "
          f"{'blk/SM':>6} {'occ':>5} {'limiter':<9} status", flush=True)
    cache = _load(a.cache)
    _CACHE.update(cache)
    rows = list(kept)
    pool = (futures.ProcessPoolExecutor(a.jobs, initializer=_init_worker, initargs=(cache,))
            if a.jobs > 1 else _Inline())
    # A run stopped by SIGTERM (``timeout``) still writes what it compiled.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with pool as ex:
        try:
            for i, (batch, used) in enumerate(ex.map(
                    check_one, variants, [archs] * len(variants), [a.headroom] * len(variants))):
                for r in batch:
                    print(_fmt(r), flush=True)
                rows += batch
                cache.update(used)
                if i % 10 == 9:
                    _write(a, rows, cache, archs, total)
        finally:
            _write(a, rows, cache, archs, total)
    failed = [r for r in rows if not r["ok"]]
    for line in summary_lines(rows):
        print(line)
    print(f"{len(variants)} variants x {len(archs)} archs in {time.perf_counter() - t0:.0f} s: "
          f"{len(failed)} failed")
    return 1 if failed else 0


def _select(a):
    """(variants to check, size of the whole set, rows kept from ``--json``)."""
    if a.recheck:
        prev = _load(a.json)
        variants = stale(prev["rows"])
        labels = {v.label for v in variants}
        return variants, prev["variants"], [r for r in prev["rows"] if r["variant"] not in labels]
    variants = _variants(a.set, num_warps=a.num_warps, num_stages=a.num_stages,
                         block_k=a.block_k, block_q=a.block_q, default_block=a.default_block)
    if a.shuffle is not None:
        random.Random(a.shuffle).shuffle(variants)
    return variants[:a.limit], len(variants), []


def stale(rows) -> list:
    """The variants of ``rows`` to check again after a plan change: those that
    failed, and those compiled with another key block than the plan now picks
    (the kernel's name carries its block: ``..._k64_...``)."""
    from pagedjax.kernels_pallas.pallas import gpu_variants as gv

    out = {}
    for r in rows:
        v = gv.GpuVariant(**r["axes"])
        block = re.search(r"_k(\d+)_", r.get("name") or "")
        if not r["ok"] or (block and int(block.group(1)) != v.plan()[2]):
            out[r["variant"]] = v
    return list(out.values())


class _Inline:
    """``--jobs 1``: the executor interface, run in this process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def map(fn, *iterables):
        return map(fn, *iterables)


def _write(a, rows, cache, archs, total) -> None:
    if a.cache:
        _save(a.cache, cache)
    if a.json:
        _save(a.json, dict(set=a.set, archs=archs, headroom=a.headroom, variants=total,
                           rows=rows))
    if a.figure:
        _save(a.figure, figure(rows, archs, a.headroom, total))


def _load(path):
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def _save(path, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    os.replace(tmp, path)


AXES = ("kind", "head_dim", "group", "page_dtype", "page_size", "window", "soft_cap",
        "kv_splits")


def summary_lines(rows) -> list[str]:
    """Worst registers, spills, shared memory and lowest occupancy per value of
    each axis, per arch (compiled rows only)."""
    out = [f"{'axis':<11} {'value':<14} {'arch':<7} {'n':>5} {'max regs':>8} "
           f"{'max spill':>9} {'max smemKB':>10} {'min occ':>7} {'failed':>6} "
           f"{'spill w/o flag':>14}"]
    done = [r for r in rows if "registers" in r]
    for axis in AXES:
        for value in sorted({r["axes"][axis] for r in done}, key=str):
            for arch in sorted({r["arch"] for r in done}):
                sel = [r for r in done if r["axes"][axis] == value and r["arch"] == arch]
                if not sel:
                    continue
                out.append(
                    f"{axis:<11} {str(value):<14} {arch:<7} {len(sel):>5} "
                    f"{max(r['registers'] for r in sel):>8} "
                    f"{max(r['spill_stores'] for r in sel):>9} "
                    f"{max(r['shared_bytes'] for r in sel) / 1024:>10.1f} "
                    f"{min(r['occupancy'] for r in sel):>7.0%} "
                    f"{sum(not r['ok'] for r in sel):>6} "
                    f"{_worst_default_alloc(sel):>14}")
    return out


MACHINE = ("2-core VM shared with other agents, no GPU (compile only: the figures are "
           "triton 3.9.0's and its ptxas', not timings); jax 0.10.2")


def _worst_default_alloc(rows) -> str:
    """Most bytes the spilling rows still spill with ptxas' default allocator
    ("-": none spilled; "?": not measured)."""
    spilled = [r.get("spill_stores_default_alloc") for r in rows if r["spill_stores"]]
    if not spilled:
        return "-"
    return "?" if None in spilled else str(max(spilled))


def figure(rows, archs, headroom, total) -> dict:
    """A benchmarks/plot.py bar figure (most registers per thread by kind and head
    size, per arch, against the headroom line) that also carries every compiled
    variant: per arch [registers, spilled bytes, shared KiB, warps, blocks per SM],
    or the reason it was skipped or failed."""
    table: dict = {}
    for r in rows:
        cell = (r.get("skipped") or r.get("error") if "registers" not in r else
                [r["registers"], r["spill_stores"], round(r["shared_bytes"] / 1024, 1),
                 r["num_warps"], r["blocks"]])
        table.setdefault(r["variant"], {})[r["arch"]] = cell
    done = [r for r in rows if "registers" in r]
    cats = sorted({(r["axes"]["kind"], r["axes"]["head_dim"]) for r in done})
    series = [dict(label=f"{arch}: most registers per thread",
                   values=[max((r["registers"] for r in done if r["arch"] == arch
                                and (r["axes"]["kind"], r["axes"]["head_dim"]) == c),
                               default=None) for c in cats]) for arch in archs]
    failed = sum(not r["ok"] for r in rows)
    return dict(
        title=f"Triton kernel, {len(table)} of {total} variants compiled for "
              f"{' and '.join(archs)}: {failed} failed the check",
        kind="bars", categories=[f"{k} d{d}" for k, d in cats], series=series,
        hlines=[dict(y=255 - headroom, label=f"255 - {headroom}: the headroom limit")],
        ylabel="registers per thread", ylim=[0, 270],
        commands=["python benchmarks/kernel_bench/gpu_compile_check.py --set full --shuffle 0 "
                  "--cache cache.json --json out.json --figure fig.json",
                  "python benchmarks/kernel_bench/gpu_compile_check.py --recheck --cache cache.json "
                  "--json out.json --figure fig.json  # after a plan change"],
        date="2026-12-05", machine=MACHINE, archs=list(archs), headroom=headroom,
        matrix=total, compiled=len(table), failed=failed,
        columns=["registers", "spill_bytes", "shared_kib", "warps", "blocks_per_sm"],
        variants=table)

if __name__ == "__main__":
    sys.exit(main())
