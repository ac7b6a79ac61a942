"""Quantized weights vs float: memory, greedy agreement, speed.

    python benchmarks/features/quantization.py                  # default model, modes: float, int8, gguf
    python benchmarks/features/quantization.py --modes float,int8 --max-tokens 16

Each mode runs in its own fresh process (``LLM(model, quantization=mode)``):
16 prompts, greedy, the first ``--max-tokens`` tokens each, ``ignore_eos``.
Reported per mode: weight bytes (``models.model_weight_bytes``), load and
generate seconds, output tokens/s, and against the float run: prompts whose
tokens agree entirely, tokens that agree position by position (until the
first difference), and the mean length of the agreeing prefix.

``float`` dequantizes a GGUF file at load (pagedjax's default), ``gguf`` keeps
its Q4/Q8 blocks on the device, ``int8`` re-quantizes per channel. Prints a
table and writes JSON (default benchmarks/results/quantization.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __package__ in (None, ""):
    sys.path.insert(0, ROOT)

from pagedjax.benchmarks import machine  # noqa: E402
DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "quantization.json")
PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
    "The three primary colors are", "To make a cup of tea, first", "Water boils at",
    "The largest planet in the solar system is", "import numpy as np\n",
    "A haiku about autumn:", "The theory of relativity states that",
    "My favourite book is", "In 1969, humans", "The best way to learn a language is",
    "SELECT name FROM users WHERE", "Photosynthesis is the process", "Dear hiring manager,",
]


def _child(model: str | None, mode: str, max_tokens: int) -> dict:
    import pagedjax.models as models
    from pagedjax import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model, quantization=None if mode == "float" else mode, max_model_len=256,
              num_pages=256)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(PROMPTS[:2], params, use_tqdm=False)  # compile the shapes first
    t0 = time.perf_counter()
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    gen_s = time.perf_counter() - t0
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return {"mode": mode, "weight_bytes": models.model_weight_bytes(llm.llm_engine.params)
            if hasattr(llm, "llm_engine") else None,
            "load_s": load_s, "generate_s": gen_s,
            "tok_per_s": sum(map(len, tokens)) / gen_s, "tokens": tokens}


def _agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    prefix = []
    for a, b in zip(ref, got):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix.append(n)
    total = sum(len(a) for a in ref)
    return {"prompts_identical": sum(p == len(a) for p, a in zip(prefix, ref)),
            "prompts": len(ref), "tokens_agreeing": sum(prefix), "tokens": total,
            "mean_prefix": sum(prefix) / len(prefix)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--modes", default="float,int8,gguf")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_child(a.model, a.child, a.max_tokens)), flush=True)
        return 0
    load_before = machine.loadavg()
    runs = {}
    for mode in a.modes.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode,
               "--max-tokens", str(a.max_tokens)] + (["--model", a.model] if a.model else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        runs[mode] = json.loads(lines[-1])
    ref = runs.get("float")
    print(f"{'mode':6} {'weights MB':>10} {'load s':>7} {'tok/s':>7} {'identical':>10} "
          f"{'agreeing tokens':>16} {'mean prefix':>11}")
    for mode, r in runs.items():
        agree = _agreement(ref["tokens"], r["tokens"]) if ref else None
        r["agreement_vs_float"] = agree
        wb = r["weight_bytes"] / 1e6 if r["weight_bytes"] else float("nan")
        ag = (f"{agree['prompts_identical']:>4}/{agree['prompts']:<5} "
              f"{agree['tokens_agreeing']:>7}/{agree['tokens']:<8} {agree['mean_prefix']:>11.1f}"
              if agree else "")
        print(f"{mode:6} {wb:>10.1f} {r['load_s']:>7.1f} {r['tok_per_s']:>7.1f} {ag}")
    out = {"runs": runs, "max_tokens": a.max_tokens, "prompts": PROMPTS,
           "machine": machine.machine(), "loadavg_before": load_before,
           "loadavg_after": machine.loadavg(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(machine.describe(out["machine"]))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
