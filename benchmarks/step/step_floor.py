"""What one engine step costs, with and without attention, per batch size.

    python benchmarks/step/step_floor.py                       # default model, 1..64 decode rows
    python benchmarks/step/step_floor.py --profile benchmarks/results/throughput.json

For each decode row count (and one prefill-sized step of ``--tokens`` tokens)
it times the model part of a step (forward + logits of the sampled rows, KV
pool donated, as the runner runs it) twice in one process:

* **full**: the configured attention backend over contexts of ``--context``
  tokens per row (distinct pages per row);
* **no attention**: the same program with attention replaced by the identity
  (projections, norms, rotary, KV writes, MLP and logits only) -- the floor
  that no attention kernel can beat on this machine.

With ``--profile`` (a ``throughput.py`` JSON) it also prices that run's steps
(its per-bucket step profile) at the no-attention cost: a lower bound on the
run's duration for any attention implementation, next to the measured one and
to what the issue's throughput goals would need.

Prints a table and writes JSON (default benchmarks/results/step_floor.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.step.step_profile import model_step_fns  # noqa: E402
from pagedjax.benchmarks.throughput import write_json  # noqa: E402

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "step_floor.json")


def _rows(n: int, tokens_each: int, context: int, page_size: int):
    """``n`` scheduled rows, each on its own pages, ending at position ``context``."""
    from pagedjax.core.scheduler import ScheduledRow

    per = -(-context // page_size)
    rows = []
    for i in range(n):
        pages = list(range(1 + i * per, 1 + (i + 1) * per))
        rows.append(ScheduledRow(f"r{i}", [1] * tokens_each, context - tokens_each, pages, 1))
    return rows


def _time(fn, reps: int) -> float:
    fn()  # compile / warm
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(ns) -> dict:
    import jax

    from pagedjax import LLM

    rows_list = [int(x) for x in ns.rows.split(",")]
    s_max = max(rows_list)
    llm = LLM(model=ns.model, max_model_len=max(ns.context, ns.tokens) + 16, max_num_seqs=s_max,
              max_num_batched_tokens=max(ns.tokens, 16),
              attention_backend=ns.attention_backend,
              num_pages=s_max * (-(-ns.context // 16)) + 64)
    runner = llm.llm_engine.runner
    # The engine's own plan, and the same with attention replaced by identity.
    full, bare = model_step_fns(runner)

    def run(fn, batch):
        logits, runner.kv_caches = fn(runner.params, runner.kv_caches, batch)
        jax.block_until_ready(logits)

    cases = [("decode", s, 1) for s in rows_list]
    if ns.tokens:
        n = max(1, ns.tokens // max(ns.prompt_chunk, 1))
        cases.append(("mixed", n, ns.tokens // n))
    out = []
    for kind, n, each in cases:
        rows = _rows(n, each, ns.context if kind == "decode" else max(each, ns.context), runner.page_size)
        batch = runner.prepare(rows, [], {}, {})[0]
        batch = jax.device_put(batch)
        t_full = _time(lambda: run(full, batch), ns.reps)
        t_bare = _time(lambda: run(bare, batch), ns.reps)
        rec = {"kind": kind, "rows": n, "tokens": n * each, "context": ns.context,
               "full_ms": 1000 * t_full, "no_attention_ms": 1000 * t_bare,
               "attention_share": 1 - t_bare / t_full}
        out.append(rec)
        if not ns.quiet:
            print(f"  {kind:<6} rows {n:>4} tokens {n * each:>5}: full {rec['full_ms']:7.1f} ms, "
                  f"no attention {rec['no_attention_ms']:7.1f} ms", flush=True)
    return {"backend": runner.attn_backend, "page_size": runner.page_size, "steps": out}


def price_profile(profile: list[dict], steps: list[dict]) -> dict:
    """Cost of a throughput run's step profile at the measured no-attention step times."""
    dec = {r["rows"]: r["no_attention_ms"] for r in steps if r["kind"] == "decode"}
    mixed = [r for r in steps if r["kind"] == "mixed"]
    floor, covered = 0.0, 0.0
    for b in profile:
        if b["kind"] == "decode":
            s = b["rows_bucket"]
            if s in dec:
                ms = dec[s]
            else:  # between measured sizes: the next larger one (an upper estimate)
                bigger = [k for k in dec if k >= s]
                ms = dec[min(bigger)] if bigger else dec[max(dec)]
        else:
            if not mixed:
                continue
            m = mixed[0]
            ms = m["no_attention_ms"] * b["tokens_bucket"] / m["tokens"]
        floor += b["steps"] * ms / 1000
        covered += b["seconds"]
    return {"no_attention_floor_s": floor, "measured_step_s": covered}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rows", default="1,2,4,8,16,32,64", help="decode row counts")
    p.add_argument("--context", type=int, default=192, help="tokens of context per decode row")
    p.add_argument("--tokens", type=int, default=512, help="tokens of the prefill-sized step (0: skip)")
    p.add_argument("--prompt-chunk", type=int, default=64, help="tokens per row in that step")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--profile", default=None, help="throughput.py JSON whose step profile to price")
    p.add_argument("--json", default=DEFAULT_JSON)
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    ns = parse_args(argv)
    import jax

    res = measure(ns)
    report = {"benchmark": "step_floor", "args": vars(ns), "date": time.strftime("%Y-%m-%d"),
              "host": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "jax": jax.__version__, "jax_backend": jax.default_backend()}, **res}
    print(f"\n{'kind':<7} {'rows':>5} {'tokens':>6} {'full ms':>9} {'no-attn ms':>10} {'attn share':>10}")
    for r in res["steps"]:
        print(f"{r['kind']:<7} {r['rows']:>5} {r['tokens']:>6} {r['full_ms']:>9.1f} "
              f"{r['no_attention_ms']:>10.1f} {r['attention_share']:>10.0%}")
    if ns.profile:
        with open(ns.profile) as f:
            tp = json.load(f)
        pj = tp["systems"]["pagedjax"]
        priced = price_profile(pj["step_profile"], res["steps"])
        priced["measured_run_s"] = pj["duration_s"]
        priced["output_tokens"] = pj["output_tokens"]
        for name, goal in (("hf_static", 5.0), ("hf_continuous", 2.0)):
            hf = tp["systems"].get(name)
            if hf and "error" not in hf:
                priced[f"run_s_needed_for_{goal:g}x_{name}"] = hf["duration_s"] / goal
        report["profile_priced"] = priced
        print(f"\n{ns.profile}: {pj['num_steps']} steps took {priced['measured_step_s']:.1f} s "
              f"(run {pj['duration_s']:.1f} s); the same steps without attention: "
              f"{priced['no_attention_floor_s']:.1f} s")
        for k, v in priced.items():
            if k.startswith("run_s_needed"):
                print(f"  {k}: {v:.1f} s")
    write_json(report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
