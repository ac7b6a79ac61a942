"""What sampling costs per step, before (jnp) and after (C++ draw), next to a model step.

    python benchmarks/kernel_bench/sampler.py                      # 16/64/128/256 rows, default model
    python benchmarks/kernel_bench/sampler.py --rows 128 --no-model

For each row count and each sampling mode -- greedy, temperature 0.8,
top-k 50, top-p 0.95 (temperature 0.8, the quick-start settings), min-p 0.05
-- it times the jitted ``pagedjax.sample.sampler.sample`` (no logprobs) on logits of
the model's vocabulary, with the draw on both paths:

* **before**: ``backend="xla"``, the jnp sampler (argmax, ``lax.top_k`` of 256
  candidates with a bisection fallback, blocked inverse CDF), unchanged from
  the sampler before the C++ draw landed;
* **after**: ``backend="native"``, the C++ draw (kernels_pallas/cpu/sampler.cc).

Two kinds of logits: **peaked** (sorted logits falling like a language model's,
``-1.3 * log(rank)`` plus noise, shuffled: the top-p nucleus holds a few
hundred tokens) and **flat** (standard normal x 3: the nucleus holds
thousands of tokens; the jnp path then takes its bisection fallback). In the
same run it times a whole greedy decode step of the model at ``--step-rows``
rows (``Runner.execute``: host preparation, the model, the sampler, copies)
and reports every sampler time as a share of it. Each figure is the median of
``--reps`` calls. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pagedjax.benchmarks import machine  # noqa: E402
from pagedjax.benchmarks.throughput import write_json  # noqa: E402

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "sampler.json")
MODES = {"greedy": dict(temperature=0.0), "temperature": dict(temperature=0.8),
         "top-k": dict(temperature=0.8, top_k=50), "top-p": dict(temperature=0.8, top_p=0.95),
         "min-p": dict(temperature=0.8, min_p=0.05)}


def make_logits(kind: str, rows: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "flat":
        return (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    base = -1.3 * np.log(np.arange(1, vocab + 1)) + 12.0
    x = base[None, :] + rng.standard_normal((rows, vocab)) * 0.3
    return np.stack([rng.permutation(r) for r in x]).astype(np.float32)


def _median_ms(fn, reps: int) -> float:
    fn()  # compile / warm
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1000 * float(np.median(ts))


def time_sampler(kinds, rows_list, vocab: int, reps: int, backends) -> list[dict]:
    import jax

    from pagedjax.sample.sampler import RowState, build_sampling_tensors, sample_jit
    from pagedjax.sampling_params import SamplingParams

    out = []
    for kind in kinds:
        for R in rows_list:
            x = jax.device_put(make_logits(kind, R, vocab))
            for mode, kw in MODES.items():
                rows = [RowState(SamplingParams(**kw), [1], [], fallback_seed=i) for i in range(R)]
                st = jax.device_put(build_sampling_tensors(rows, R, vocab, 8))
                rec = {"logits": kind, "rows": R, "mode": mode}
                for label, be in backends:
                    rec[f"{label}_ms"] = _median_ms(
                        lambda: jax.block_until_ready(sample_jit(x, st, backend=be)), reps)
                out.append(rec)
                print(f"  {kind:<6} {R:>4} rows {mode:<11} "
                      + "  ".join(f"{lb} {rec[f'{lb}_ms']:7.1f} ms" for lb, _ in backends),
                      flush=True)
    return out


def time_model_step(model: str | None, rows: int, context: int, reps: int) -> dict:
    """A whole greedy decode step (Runner.execute) of ``rows`` rows at ``context`` tokens."""
    from pagedjax import LLM
    from pagedjax.worker.inputs import SampleRow
    from pagedjax.sample.sampler import RowState
    from pagedjax.sampling_params import SamplingParams
    from pagedjax.core.scheduler import ScheduledRow

    per = -(-context // 16)
    llm = LLM(model=model, max_model_len=context + 16, max_num_seqs=rows,
              num_pages=rows * per + 8)
    runner = llm.llm_engine.runner
    sched = [ScheduledRow(f"r{i}", [1], context - 1, list(range(1 + i * per, 1 + (i + 1) * per)))
             for i in range(rows)]
    greedy = SamplingParams(temperature=0.0)
    srows = [SampleRow(r.request_id, i, RowState(greedy, [1], []), None)
             for i, r in enumerate(sched)]
    ms = _median_ms(lambda: runner.execute(sched, srows), reps)
    return {"rows": rows, "context": context, "step_ms": ms, "vocab": runner.vocab_size,
            "attention_backend": runner.attn_backend}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rows", default="16,64,128,256")
    p.add_argument("--logits", default="peaked,flat", help="comma list of peaked, flat")
    p.add_argument("--vocab", type=int, default=None, help="default: the model's")
    p.add_argument("--step-rows", type=int, default=128)
    p.add_argument("--context", type=int, default=192, help="context tokens per row of the step")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-model", action="store_true", help="skip the model step (vocab 49152)")
    p.add_argument("--json", default=DEFAULT_JSON)
    return p.parse_args(argv)


def main(argv=None) -> int:
    ns = parse_args(argv)
    import jax

    from pagedjax.kernels_pallas.cpu import sampler as cpu_sampler

    report = {"benchmark": "sampler", "args": vars(ns), "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": machine.machine(), "jax_backend": jax.default_backend()}
    step = None
    if not ns.no_model:
        print(f"model step: {ns.step_rows} rows ...", flush=True)
        step = time_model_step(ns.model, ns.step_rows, ns.context, ns.reps)
        report["model_step"] = step
    vocab = ns.vocab or (step["vocab"] if step else 49152)
    backends = [("before", "xla")]
    if cpu_sampler.available():
        backends.append(("after", "native"))
    else:
        report["native_unavailable"] = cpu_sampler.unavailable_reason()
    rows_list = [int(r) for r in ns.rows.split(",")]
    res = time_sampler(ns.logits.split(","), rows_list, vocab, ns.reps, backends)
    report["vocab"] = vocab
    report["results"] = res
    report["machine"]["loadavg_end"] = machine.loadavg()
    print_table(report)
    write_json(report, ns.json)
    return 0


def print_table(report: dict) -> None:
    step = report.get("model_step")
    has_after = any("after_ms" in r for r in report["results"])
    hdr = f"{'logits':<7} {'rows':>5} {'mode':<11} {'before ms':>10}"
    if has_after:
        hdr += f" {'after ms':>9} {'speedup':>8}"
    if step:
        hdr += f" {'share of step':>14}"
    print(f"\nvocab {report['vocab']}" + (
        f"; model decode step at {step['rows']} rows: {step['step_ms']:.1f} ms" if step else ""))
    print(hdr)
    print("-" * len(hdr))
    for r in report["results"]:
        line = f"{r['logits']:<7} {r['rows']:>5} {r['mode']:<11} {r['before_ms']:>10.1f}"
        best = r.get("after_ms", r["before_ms"])
        if has_after:
            line += f" {r['after_ms']:>9.1f} {r['before_ms'] / r['after_ms']:>7.1f}x"
        if step and r["rows"] == step["rows"]:
            line += f" {best / step['step_ms']:>13.0%}"
        print(line)
    print(f"machine: {machine.describe(report['machine'])}; load at the end "
          f"{report['machine']['loadavg_end']}")


if __name__ == "__main__":
    sys.exit(main())
