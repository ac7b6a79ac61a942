"""The decode step beside a busy host thread: how much a core-hungry neighbour slows it.

    python benchmarks/step/host_contention.py                       # default model, gguf, 1 row
    PYTHONPATH=/other/checkout python benchmarks/step/host_contention.py --tag before

On a CPU the engine's host thread (scheduling, input preparation, dispatch,
output processing: about 1.3-1.7 ms of CPU a one-row step of the default
model) shares the cores with the C++ kernels' threads, which split each
matmul between the cores. This times the jitted model part of a decode step
(forward + logits, KV pool donated) in a loop of ``--steps`` back-to-back
calls, once alone and once beside a separate process that burns CPU for
``duty`` of every 6 ms period (``--duties``: 0.25 is about the host thread's
share at one row) and sleeps the rest. Each duty runs ``--rounds`` times,
alternating; the table gives the median ms a step and its range, and the
slowdown against the idle loop. If the kernels kept every core busy and lost
only the CPU the burner takes (d of one core), a step of T0 ms alone would take
T0 / (1 - d / cores) (the "ideal" column); threads that wait on a preempted
partner pay more.

Prints a table and writes JSON (default benchmarks/results/host_contention[_TAG].json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __package__ in (None, ""):
    sys.path.append(ROOT)  # after PYTHONPATH: --tag runs measure another checkout

from pagedjax.benchmarks import machine  # noqa: E402

PERIOD_S = 0.006


def burn(duty: float, seconds: float) -> None:
    """Busy for ``duty`` of every PERIOD_S, asleep the rest, for ``seconds``."""
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duty * PERIOD_S:
            pass
        time.sleep(PERIOD_S * (1.0 - duty))


def step_loop(model: str, quantization: str, rows: int, context: int):
    """A function running ``n`` back-to-back decode steps, returning ms a step."""
    import jax

    from pagedjax import LLM
    from benchmarks.step.step_profile import _rows, model_step_fns

    llm = LLM(model=model, max_model_len=context + 16, max_num_seqs=max(2, rows),
              num_pages=rows * (-(-context // 16)) + 8, quantization=quantization)
    runner = llm.llm_engine.runner
    batch = jax.device_put(runner.prepare(_rows(rows, context, runner.page_size), [], {}, {})[0])
    full, _ = model_step_fns(runner)

    def run(n: int) -> float:
        kv = runner.kv_caches
        logits, kv = full(runner.params, kv, batch)
        logits.block_until_ready()
        t0 = time.perf_counter()
        for _ in range(n):
            logits, kv = full(runner.params, kv, batch)
        logits.block_until_ready()
        runner.kv_caches = kv
        return (time.perf_counter() - t0) / n * 1e3

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--quantization", default="gguf")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--duties", default="0,0.25,0.5")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="")
    ap.add_argument("--json", default=None)
    ap.add_argument("--burn", nargs=2, type=float, help=argparse.SUPPRESS)  # (duty, seconds)
    ns = ap.parse_args(argv)
    if ns.burn:
        burn(*ns.burn)
        return 0
    duties = [float(d) for d in ns.duties.split(",")]
    run = step_loop(ns.model, ns.quantization, ns.rows, ns.context)
    run(50)  # warm
    load0 = machine.loadavg()
    times: dict[float, list[float]] = {d: [] for d in duties}
    for k in range(ns.rounds):
        for d in duties if k % 2 == 0 else duties[::-1]:
            burner = None
            if d > 0:
                burner = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--burn",
                                           str(d), "600"])
                time.sleep(0.3)
            try:
                times[d].append(run(ns.steps))
            finally:
                if burner is not None:
                    burner.kill()
                    burner.wait()
    idle = statistics.median(times[0.0]) if 0.0 in times else None
    m = machine.machine()
    print(machine.describe(m))
    print(f"\n{ns.model}, quantization={ns.quantization}, {ns.rows} row(s) at {ns.context} "
          f"tokens of context, {ns.steps} steps a loop, median of {ns.rounds} rounds [range]")
    print(f"{'burner duty':>11} {'ms / step':>10} {'range':>15} {'slowdown':>9} {'ideal':>7}")
    rows = []
    for d in duties:
        med = statistics.median(times[d])
        slow = med - idle if idle is not None else None
        # the kernels keep every core busy for T0: with the burner's d of each core-second
        # taken from them, T = T0 / (1 - d / cores)
        ideal = idle / (1.0 - d / (os.cpu_count() or 1)) - idle if idle is not None else None
        rows.append({"duty": d, "ms_per_step": med, "all_ms": times[d], "slowdown_ms": slow,
                     "ideal_slowdown_ms": ideal})
        rng = f"[{min(times[d]):.2f}-{max(times[d]):.2f}]"
        print(f"{d:>11.2f} {med:>10.2f} {rng:>15} "
              f"{'' if slow is None else f'{slow:+.2f}':>9} "
              f"{'' if ideal is None else f'{ideal:+.2f}':>7}")
    report = {"machine": m, "model": ns.model, "quantization": ns.quantization,
              "rows": ns.rows, "context": ns.context, "steps": ns.steps, "rounds": ns.rounds,
              "tag": ns.tag, "loadavg_before": load0, "loadavg_after": machine.loadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "results": rows}
    from pagedjax.benchmarks.throughput import write_json

    name = "host_contention" + (f"_{ns.tag}" if ns.tag else "") + ".json"
    write_json(report, ns.json or os.path.join(ROOT, "benchmarks", "results", name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
