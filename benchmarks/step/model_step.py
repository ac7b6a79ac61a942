"""Compile time and step time of the model part of a decode step (forward + logits).

    python benchmarks/step/model_step.py                         # float, int8, gguf; 16 rows
    PYTHONPATH=/other/checkout python benchmarks/step/model_step.py --modes float --tag before

Loads the default model (or ``--model``) with each ``quantization`` mode in its
own fresh process, jits forward + compute_logits over ``--rows`` decode rows
with ``--context`` tokens of context each (xla attention backend), and reports
the trace and compile time (compile includes the trace), the optimized HLO size, the best /
median of ``--reps`` steps, the step's scratch memory (XLA's temp buffer) and the minor page
faults per step. Run it from two checkouts (``--tag``) to compare code versions on the
same machine. Prints a table and writes JSON (default
benchmarks/results/model_step[_TAG].json).
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
    sys.path.append(ROOT)  # after PYTHONPATH: --tag runs measure another checkout

from pagedjax.benchmarks import machine  # noqa: E402


def _child(model, mode: str, rows: int, context: int, reps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pagedjax.models as models
    from pagedjax.models.metadata import SeqChunk, build_metadata

    kw = {} if mode == "float" else {"quantization": mode}
    m, p = models.load_model(model, dtype="float32", **kw)
    ps = 16
    per = -(-context // ps)
    chunks = [SeqChunk(list(range(1 + i * per, 1 + (i + 1) * per)), context - 1, 1)
              for i in range(rows)]
    meta = build_metadata(chunks, ps, pages_per_seq=per)
    kv = m.allocate_kv_caches(rows * per + 1, ps)
    ids = jnp.ones((rows,), jnp.int32)

    def step(p, kv, ids, meta):
        h, kv = m.forward(p, kv, ids, meta)
        return m.compute_logits(p, h), kv

    t0 = time.perf_counter()
    lowered = jax.jit(step, donate_argnums=1).lower(p, kv, ids, meta)
    trace_s = time.perf_counter() - t0
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    out, kv = compiled(p, kv, ids, meta)
    out.block_until_ready()
    import resource

    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out, kv = compiled(p, kv, ids, meta)
        out.block_until_ready()
        times.append(time.perf_counter() - t0)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / reps
    weights = sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(p))
    return {"mode": mode, "trace_s": trace_s, "compile_s": compile_s, "hlo_lines": len(compiled.as_text().splitlines()),
            "step_ms_best": 1e3 * min(times), "step_ms_median": 1e3 * float(np.median(times)),
            "weight_bytes": int(weights), "minor_page_faults_per_step": faults,
            "scratch_bytes": int(compiled.memory_analysis().temp_size_in_bytes)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--modes", default="float,int8,gguf")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tag", default="")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_child(a.model, a.child, a.rows, a.context, a.reps)), flush=True)
        return 0
    runs = []
    for mode in a.modes.split(","):
        load0 = machine.loadavg()
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--rows", str(a.rows),
               "--context", str(a.context), "--reps", str(a.reps)]
        cmd += ["--model", a.model] if a.model else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        r = json.loads(lines[-1])
        r.update(loadavg_before=load0, loadavg_after=machine.loadavg())
        runs.append(r)
    print(f"{'mode':6} {'weights MB':>10} {'trace s':>7} {'compile s':>9} {'HLO lines':>9} "
          f"{'best ms':>8} {'median ms':>9} {'scratch MB':>10} {'faults/step':>11}")
    for r in runs:
        print(f"{r['mode']:6} {r['weight_bytes'] / 1e6:>10.1f} {r['trace_s']:>7.2f} "
              f"{r['compile_s']:>9.2f} "
              f"{r['hlo_lines']:>9} {r['step_ms_best']:>8.1f} {r['step_ms_median']:>9.1f} "
              f"{r.get('scratch_bytes', 0) / 1e6:>10.1f} {r.get('minor_page_faults_per_step', 0):>11.0f}")
    m = machine.machine()
    print(machine.describe(m))
    path = a.json or os.path.join(ROOT, "benchmarks", "results",
                                  f"model_step{'_' + a.tag if a.tag else ''}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"runs": runs, "rows": a.rows, "context": a.context, "tag": a.tag,
                   "code": os.environ.get("PYTHONPATH", ROOT), "machine": m,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
