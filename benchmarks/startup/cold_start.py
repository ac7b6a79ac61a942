"""Start-up from a cold cache and from a warm one, default configuration.

    python benchmarks/startup/cold_start.py                 # cold process, then warm process
    python benchmarks/startup/cold_start.py --runs cold

Each run is a fresh ``python`` process whose ``PAGEDJAX_CACHE`` (tokenizers,
XLA's persistent compilation cache) and ``PAGEDJAX_CACHE_DIR`` (the C++
builds and the per-machine matmul measurement) point at one temporary
folder: empty for the **cold** run, the cold run's leftovers for the **warm**
run. In that process, in order:

* ``load``: ``LLM()`` on the default model (SmolLM2-135M GGUF): reading the
  model, and on a cold cache building the C++ kernels and the C++ sampler
  (compile + self-test in a child process each; the builds run on
  background threads beside the loading, their own seconds are reported
  apart) and the per-machine matmul row limit (``cpu_matmul_rows``);
* ``warmup``: ``runner.warmup()``, with its XLA compilation count;
* ``generate``: a short greedy and top-p ``generate``, which must compile
  nothing (``compilations`` is asserted 0 in the JSON's ``ok``).

Wall seconds, CPU seconds and XLA programs obtained (compiled, or read back
from the persistent cache: those are counted apart) are reported per phase. CPU seconds are this
process's threads plus its finished children (the compiler, the
self-tests): on a shared machine they move much less than wall time with a
busy neighbour, so the goal (warm-up from a cold cache under 60 s) is read
in CPU seconds under load and in wall seconds on a quiet machine. Prints a
table and writes JSON (``benchmarks/results/cold_start.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pagedjax.benchmarks import machine  # noqa: E402

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                            "cold_start.json")
PHASES = ("import", "load", "warmup", "generate")


def _cpu() -> float:
    """CPU seconds of this process's threads and of its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Phases:
    """Wall and CPU seconds and XLA compilations of named phases."""

    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.compiles = lambda: 0
        self.hits = lambda: 0

    def run(self, name: str, fn):
        w, c, n, h = time.perf_counter(), _cpu(), self.compiles(), self.hits()
        out = fn()
        self.rows[name] = {"wall_s": time.perf_counter() - w, "cpu_s": _cpu() - c,
                           "compilations": self.compiles() - n,
                           "disk_cache_hits": self.hits() - h}
        return out


def child(max_tokens: int, workers: int | None, model: str | None, max_num_seqs: int,
          engine_args: dict | None = None) -> dict:
    """One start-up in this process (the caches come from the environment)."""
    ph = Phases()
    durations: list[float] = []  # seconds of each XLA backend compilation, in order

    def imports():
        import jax  # noqa: F401

        import pagedjax  # noqa: F401
        from pagedjax.worker.plan import CompileCounter

        CompileCounter.install()
        ph.compiles = lambda: CompileCounter.count
        ph.hits = lambda: CompileCounter.cache_hits
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, d, **_: event == "/jax/core/compile/backend_compile_duration"
            and durations.append(d))

    ph.run("import", imports)
    from pagedjax.kernels_pallas.cpu import build as cpu_build, matmul_rows as cpu_matmul_rows
    from pagedjax import LLM, SamplingParams

    llm = ph.run("load", lambda: LLM(model, max_num_seqs=max_num_seqs, **(engine_args or {})))
    runner = llm.llm_engine.runner
    ph.run("warmup", lambda: runner.warmup(progress=False, workers=workers))
    prompts = ["The capital of France is", "Write a haiku about the sea.",
               "List three prime numbers:"]
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens),
              SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, seed=0),
              SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=5)]
    outs = ph.run("generate", lambda: llm.generate(prompts, params, use_tqdm=False))
    info = {n: cpu_build.build_info(n) for n in ("cpu_kernels", "cpu_sampler")}
    return {"phases": ph.rows, "native_matmul_rows": cpu_matmul_rows.native_matmul_rows(),
            "builds": {n: i and {"flags": i["flags"], "seconds": i["seconds"],
                                 "cached": i["cached"],
                                 "rejected": [list(r) for r in i["rejected"]]}
                       for n, i in info.items()},
            "attention_backend": llm.llm_engine.attn_backend,
            "warmup_shapes": len(runner.warmup_shapes()),
            "generated_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "compile_durations_s": durations}


def run_child(cache: str, ns: argparse.Namespace) -> dict:
    env = dict(os.environ, PAGEDJAX_CACHE=cache, PAGEDJAX_CACHE_DIR=cache)
    env.pop("PAGEDJAX_NATIVE_MATMUL_ROWS", None)  # measured, as a new user's first start
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--max-tokens",
           str(ns.max_tokens), "--max-num-seqs", str(ns.max_num_seqs),
           "--engine-args", json.dumps(ns.engine_args)]
    if ns.workers is not None:
        cmd += ["--workers", str(ns.workers)]
    if ns.model is not None:
        cmd += ["--model", ns.model]
    w, c = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=ns.timeout)
    c2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"start-up process failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process"] = {"wall_s": time.perf_counter() - w,
                      "cpu_s": (c2.ru_utime + c2.ru_stime) - (c.ru_utime + c.ru_stime)}
    return out


def table(results: dict) -> str:
    lines = ["| run | phase | wall s | CPU s | XLA programs (read from the disk cache) |",
             "|---|---|---|---|---|"]
    for run, res in results.items():
        for name in PHASES:
            p = res["phases"][name]
            lines.append(f"| {run} | {name} | {p['wall_s']:.1f} | {p['cpu_s']:.1f} | "
                         f"{p['compilations']} ({p['disk_cache_hits']}) |")
        cold = sum(res["phases"][n]["wall_s"] for n in ("load", "warmup"))
        cold_cpu = sum(res["phases"][n]["cpu_s"] for n in ("load", "warmup"))
        lines.append(f"| {run} | **load + warm-up** | **{cold:.1f}** | **{cold_cpu:.1f}** | |")
        for name, b in res["builds"].items():
            if b:
                lines.append(f"| {run} | (in load) C++ {name} build, {' '.join(b['flags'])}"
                             f"{', cached' if b['cached'] else ''} | {b['seconds']:.1f} | | |")
        lines.append(f"| {run} | whole process | {res['process']['wall_s']:.1f} | "
                     f"{res['process']['cpu_s']:.1f} | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="cold,warm", help="cold, warm or cold,warm")
    ap.add_argument("--max-tokens", type=int, default=16, help="per prompt of the generate")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="the engine's (default 64)")
    ap.add_argument("--workers", type=int, default=None,
                    help="warm-up's compiling threads (default: pagedjax's, the usable cores)")
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--engine-args", type=json.loads, default={},
                    help='more LLM(...) settings as JSON, e.g. \'{"tensor_parallel_size": 2}\' '
                         "(with XLA_FLAGS=--xla_force_host_platform_device_count=2 on the CPU)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.child:
        print(json.dumps(child(ns.max_tokens, ns.workers, ns.model, ns.max_num_seqs,
                               ns.engine_args)))
        return 0
    runs = [r.strip() for r in ns.runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in ("cold", "warm")]
    if bad or not runs:
        ap.error(f"--runs: expected cold and/or warm, got {ns.runs!r}")
    results, load = {}, {"before": machine.loadavg()}
    with tempfile.TemporaryDirectory(prefix="pagedjax-cold-") as cache:
        for run in runs:  # "warm" reuses what the cold run (if any) left in `cache`
            if run == "warm" and "cold" not in results:
                run_child(cache, ns)  # fill the caches first
            results[run] = run_child(cache, ns)
            load[f"after_{run}"] = machine.loadavg()
    ok = all(r["phases"]["generate"]["compilations"] == 0 for r in results.values())
    print(table(results))
    print(f"compilations in generate after warm-up: "
          f"{[r['phases']['generate']['compilations'] for r in results.values()]} "
          f"({'ok' if ok else 'FAILED'}); load average {load}")
    print(machine.describe(machine.machine()))
    os.makedirs(os.path.dirname(os.path.abspath(ns.json)), exist_ok=True)
    with open(ns.json, "w") as f:
        json.dump({"results": results, "ok": ok, "loadavg": load, "machine": machine.machine(),
                   "argv": sys.argv[1:], "workers": ns.workers,
                   "model": ns.model, "max_num_seqs": ns.max_num_seqs,
                   "engine_args": ns.engine_args}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
