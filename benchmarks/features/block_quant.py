"""GGUF blocks kept quantized (the C++ block kernel) vs dequantized to float32 at load.

    python benchmarks/features/block_quant.py                 # default model, 2 rounds
    python benchmarks/features/block_quant.py --rounds 3 --rows 1,16,64,128

Each mode (``none``: float32 weights; ``gguf``: the file's blocks through the
C++ block kernel, every step routed to it; ``int8``: per-channel int8 for the
weight-memory column) runs in a fresh process of its own, the modes'
order alternating between rounds, and reports:

* weight memory on the device (the engine's ``weight_bytes``);
* single-stream decode: one request of ``--tokens`` greedy tokens (EOS
  ignored), decode tokens per second = (tokens - 1) / (time of the request -
  time of the same request with one token);
* the model part of a decode step at each of ``--rows`` rows (forward + logits,
  ``--context`` tokens of context a row, the engine's own execution plan), next
  to the float32 matmul floor measured in the same process: every matmul of
  that step (the model's weights dequantized to float32, the tied LM head
  included), one after another, and nothing else, XLA's GEMM or the C++ float
  matmul, whichever is faster at that row count.

Ratios are taken within one round (same machine state); prints a table and
writes JSON (default benchmarks/results/block_quant.json).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "block_quant.json")
# What model_step_fns' programs read of a batch (a pytree).
Batch = collections.namedtuple("Batch", "token_ids meta logits_index")


def _best(fn, reps: int) -> float:
    import jax

    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return best


def _floor_fns(model, params):
    """rows -> seconds of every float32 matmul of a step (best of XLA and C++)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from pagedjax.kernels_pallas.cpu import native as cpu_native
    from pagedjax.models import quant as Q

    flat = dict(nnx.traversals.flatten_mapping(params))
    mats, head = [], None
    for path, kind in model.quantized.items():
        comps = {c: flat[path + (c,)] for c in Q.formats(kind)}
        w = Q.dequantize(kind, comps, 0 if path[-1] == "kernel" else -1, jnp.float32)
        if path[-1] == "kernel":
            mats.append(w.reshape(w.shape[0], -1))
        else:
            head = w
    for path, a in flat.items():
        if path[-1] == "kernel" and path not in model.quantized:
            mats.append(a.reshape(a.shape[0], -1))
        elif path[-1] == "embedding" and head is None:
            head = a
    mats = [jax.block_until_ready(m) for m in mats]

    def fn(mm, mm_t):
        def chain(xs, ws, e, xh):  # one after another, as in a step (a zero carried along)
            s, out = jnp.zeros((), jnp.float32), []
            for x, w in zip(xs, ws):
                out.append(mm(x + s, w))
                s = out[-1][0, 0] * 0.0
            return out, mm_t(xh + s, e)
        return jax.jit(chain)

    xla = fn(lambda x, w: x @ w, lambda x, e: x @ e.T)
    cpp = fn(cpu_native.matmul, lambda x, e: cpu_native.matmul(x, e, transposed=True))

    def floor(rows: int, reps: int) -> float:
        xs = [jnp.ones((rows, w.shape[0]), jnp.float32) * 0.01 for w in mats]
        xh = jnp.ones((rows, head.shape[1]), jnp.float32) * 0.01
        return min(_best(lambda f=f: f(xs, mats, head, xh), reps) for f in (xla, cpp))
    return floor


def _child(model: str, mode: str, rows: list[int], context: int, tokens: int, reps: int) -> dict:
    import jax
    import jax.numpy as jnp

    from benchmarks.step_profile import model_step_fns
    from pagedjax import LLM, SamplingParams
    from pagedjax.models.metadata import SeqChunk, build_metadata

    llm = LLM(model, quantization=mode, max_num_seqs=max(rows), max_model_len=context + 256,
              cpu_kv_cache_gib=0.5)
    eng = llm.llm_engine
    out = {"mode": mode, "weight_bytes": int(eng.weight_bytes),
           "block_matmul_rows": eng.runner.plan.block_matmul_rows,
           "native_matmul_rows": eng.runner.plan.native_matmul_rows}
    if mode == "int8":
        return out
    prompt = "Tell me a long story about a lighthouse keeper and the sea."

    def gen(n):
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        t = time.perf_counter()
        llm.generate([prompt], sp, use_tqdm=False)
        return time.perf_counter() - t
    gen(tokens), gen(1)  # compile every bucket on the way
    t_full = min(gen(tokens) for _ in range(2))
    t_one = min(gen(1) for _ in range(3))
    out["decode_tok_s"] = (tokens - 1) / max(t_full - t_one, 1e-9)
    runner = eng.runner
    full, _ = model_step_fns(runner)
    floor = _floor_fns(runner.model, runner.params)
    ps = runner.page_size
    per = -(-context // ps)
    out["steps"] = {}
    for r in rows:
        meta = build_metadata([SeqChunk(list(range(1 + i * per, 1 + (i + 1) * per)), context - 1, 1)
                               for i in range(r)], ps, pages_per_seq=per)
        kv = runner.model.allocate_kv_caches(r * per + 1, ps)

        batch = Batch(jnp.ones((r,), jnp.int32), meta, jnp.arange(r, dtype=jnp.int32))
        state = {"kv": kv}

        def step():
            logits, state["kv"] = full(runner.params, state["kv"], batch)
            return logits
        step_s = _best(step, reps)
        floor_s = floor(r, reps)
        out["steps"][str(r)] = {"step_ms": 1e3 * step_s, "floor_ms": 1e3 * floor_s,
                           "step_over_floor": step_s / floor_s}
        del kv, state
        jax.clear_caches()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--modes", default="none,gguf,int8")
    ap.add_argument("--rows", default="1,16,64,128")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    rows = [int(r) for r in ns.rows.split(",")]
    if ns.child:
        sys.path.insert(0, ROOT)
        res = _child(ns.model, ns.child, rows, ns.context, ns.tokens, ns.reps)
        print("RESULT" + json.dumps(res))
        return 0
    modes = ns.modes.split(",")
    env = dict(os.environ, PAGEDJAX_BLOCK_MATMUL_ROWS=os.environ.get(
        "PAGEDJAX_BLOCK_MATMUL_ROWS", "4096"))  # gguf: every step through the kernel
    rounds = []
    for i in range(ns.rounds):
        res = {}
        for mode in modes if i % 2 == 0 else modes[::-1]:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--rows", ns.rows,
                   "--context", str(ns.context), "--tokens", str(ns.tokens), "--reps", str(ns.reps)]
            if ns.model:
                cmd += ["--model", ns.model]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
            if r.returncode or not line:
                raise SystemExit(f"{mode} failed:\n{r.stderr[-3000:]}")
            res[mode] = json.loads(line[0][len("RESULT"):])
        rounds.append(res)
        _print_round(i, res, rows)
    report = {"benchmark": "block_quant", "args": vars(ns), "date": time.strftime("%Y-%m-%d"),
              "machine": os.uname().nodename, "cpus": os.cpu_count(), "rounds": rounds}
    os.makedirs(os.path.dirname(ns.json), exist_ok=True)
    with open(ns.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {ns.json}")
    return 0


def _print_round(i: int, res: dict, rows: list[int]) -> None:
    print(f"round {i + 1}")
    head = "  ".join(f"{r:>4} rows step/floor ms" for r in rows)
    print(f"  mode   weights MiB  decode tok/s  {head}")
    for mode, m in res.items():
        steps = m.get("steps", {})
        cells = "  ".join(f"{steps[str(r)]['step_ms']:7.1f}/{steps[str(r)]['floor_ms']:<7.1f}"
                          f" ({steps[str(r)]['step_over_floor']:.2f}x)" for r in rows if steps)
        tok = f"{m['decode_tok_s']:8.1f}" if "decode_tok_s" in m else "       -"
        print(f"  {mode:<6} {m['weight_bytes'] / 2**20:10.1f}  {tok}      {cells}")
    if "none" in res and "gguf" in res:
        ratio = res["gguf"]["decode_tok_s"] / res["none"]["decode_tok_s"]
        print(f"  decode tok/s gguf / none: {ratio:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
