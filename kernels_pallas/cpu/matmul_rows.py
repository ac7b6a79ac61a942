"""Up to how many rows a step's matmuls run in the C++ kernel, on this machine.

The C++ few-row matmul (``cpu_native.matmul``) beats XLA:CPU's GEMM at 2-32
rows on a 2-core AMD Zen 3, loses at every row count on a 2-core Intel
AVX-512 Xeon, and on a 2-core AMD EPYC with AVX-512 ties at 1 row, wins at
2-8 and loses at 16-32 (BENCHMARKS.md#few-row-matmul), so the limit is measured, not
assumed: once per machine and build, a SmolLM2-shaped
``[rows, 576] @ [576, 1536]`` matmul is timed with both at 1, 2, 4, 8, 16 and
32 rows, about two seconds in all. It runs over 32 distinct weight matrices
(113 MB, more than a last-level cache holds), so that they come from memory
as a model's do; over 4 (14 MB, cached) the choice flipped between runs on
that EPYC (1, 4 or 16 rows), over 32 it gives
8, the count a whole model's 30 layers favour. (Decode steps of 1, 2 and 4 rows are shape
buckets of their own: one user's tokens take the one-row program.) The
limit is the row count whose routing saves most, summed over the measured
counts up to it (``choose_rows``; 0: never).
It is cached beside the kernel's build
(``<cache>/native/cpu_matmul_<key>.matmul_rows.json``, the key of the build:
source, compiler, flags, jaxlib, CPU), so every process on the machine uses
the same limit, and within a process it is decided once: an engine's
execution plan, and so its compiled programs, depend only on it.

``PAGEDJAX_NATIVE_MATMUL_ROWS=<n>`` sets the limit instead (0 turns the C++
matmul off).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from pagedjax.kernels_pallas.cpu import row_limit

ENV = "PAGEDJAX_NATIVE_MATMUL_ROWS"
CANDIDATE_ROWS = (1, 2, 4, 8, 16, 32)
MARGIN = 0.95  # the chosen routing must save 5% of one count's time (else XLA's path)
FORMAT = 4     # version of the cache file's contents (4: from one row up, 32 weights, summed rule)

_lock = threading.Lock()
_chosen: int | None = None


def choose_rows(timings: Mapping[int, tuple[float, float]], margin: float = MARGIN) -> int:
    """The row count r whose routing saves most: steps of up to r rows run in C++, so
    r's cost is the sum over measured counts c <= r of (C++ / XLA time at c) - 1, each
    count weighed alike; the least sum wins, and 0 unless it saves at least
    ``1 - margin`` of one count's time. One noisy count (one row, bound by reading
    its weights on either path, times within +-7% of XLA's) cannot veto the others.

    ``timings`` maps rows -> (C++ seconds, XLA seconds)."""
    best, best_cost, cost = 0, -(1.0 - margin), 0.0
    for r in sorted(timings):
        cpp, xla = timings[r]
        cost += cpp / xla - 1.0
        if cost < best_cost:
            best, best_cost = r, cost
    return best


def measure(rows=CANDIDATE_ROWS, reps: int = 10, n_weights: int = 32, k: int = 576,
            n: int = 1536) -> dict[int, tuple[float, float]]:
    """rows -> (C++ s, XLA s): the best of ``reps`` jitted calls that each multiply
    ``x [rows, k]`` by ``n_weights`` distinct ``[k, n]`` matrices; C++ and XLA alternate."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pagedjax.kernels_pallas.cpu import native as cpu_native

    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.standard_normal((k, n), np.float32) * 0.05) for _ in range(n_weights)]

    def chain(mm):
        return jax.jit(lambda x, ws: [mm(x, w) for w in ws])

    fns = {"cpp": chain(cpu_native.matmul), "xla": chain(lambda x, w: x @ w)}
    out = {}
    for r in rows:
        x = jnp.asarray(rng.standard_normal((r, k), np.float32))
        best = {name: float("inf") for name in fns}
        for name, f in fns.items():
            jax.block_until_ready(f(x, ws))  # compile, warm
        for i in range(reps):
            for name in (("cpp", "xla") if i % 2 == 0 else ("xla", "cpp")):
                t = time.perf_counter()
                jax.block_until_ready(fns[name](x, ws))
                best[name] = min(best[name], time.perf_counter() - t)
        out[r] = (best["cpp"], best["xla"])
    return out


def cache_path(library: str | os.PathLike) -> Path:
    """Where the limit for the kernel build at ``library`` (its .so) is cached."""
    return Path(library).with_suffix(".matmul_rows.json")


def read_cache(path: Path) -> int | None:
    """The cached limit, or None when there is none or it is unreadable."""
    data = row_limit.read_json(path, FORMAT)
    rows = data.get("rows") if data else None
    return rows if row_limit.is_rows(rows) else None


def write_cache(path: Path, rows: int, timings: Mapping[int, tuple[float, float]],
                load: dict | None = None) -> None:
    """Write atomically (concurrent processes each write a whole file); ``load``: the
    machine's load when measured (row_limit.cached)."""
    row_limit.write_json(path, {
        "format": FORMAT, "rows": int(rows), "margin": MARGIN, **(load or {}),
        "timings_s": {str(r): {"cpp": c, "xla": x} for r, (c, x) in timings.items()}})


def env_override() -> int | None:
    """``$PAGEDJAX_NATIVE_MATMUL_ROWS`` as a row count, None when unset."""
    return row_limit.env_rows(ENV, "matmuls")


def decide(library: str | os.PathLike | None, measure_fn=measure) -> int:
    """The limit for the kernel build at ``library``: the environment's, else the
    cached one, else measured (``measure_fn``) and cached. 0 without a library."""
    override = env_override()
    if override is not None:
        return override
    if library is None:
        return 0
    return row_limit.cached(cache_path(library), read_cache, measure_fn, choose_rows,
                            write_cache)


def native_matmul_rows() -> int:
    """This process's limit (decided once; 0 when the vectorized C++ matmul is not built)."""
    global _chosen
    with _lock:
        if _chosen is None:
            from pagedjax.kernels_pallas.cpu import build as cpu_build, native as cpu_native

            info = cpu_build.build_info("cpu_matmul") if cpu_native.fast_matmul() else None
            _chosen = decide(info["so"] if info else None)
        return _chosen


def main(argv=None) -> int:
    """``python -m pagedjax.kernels_pallas.cpu.matmul_rows [--weights N] [--runs K]``: measure K
    times and print each run's C++ / XLA time ratio per row count and the limit the rule
    would choose (the cache is neither read nor written)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=int, default=32, help="distinct weight matrices")
    ap.add_argument("--runs", type=int, default=3)
    ns = ap.parse_args(argv)
    for _ in range(ns.runs):
        t = measure(n_weights=ns.weights)
        ratios = "  ".join(f"{r}: {c / x:.2f}" for r, (c, x) in sorted(t.items()))
        print(f"{ns.weights} weights, C++ / XLA time at rows  {ratios}  -> limit "
              f"{choose_rows(t)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
