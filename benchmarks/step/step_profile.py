"""Where a decode step's time goes, per batch size, next to the same run's matmul floor.

    python benchmarks/step/step_profile.py                     # default model, 16/64/128/256 rows
    python benchmarks/step/step_profile.py --rows 64,128 --context 256
    python benchmarks/step/step_profile.py --rows 1,16,64,128 --quantization gguf

For each row count R (every row one new token at ``--context`` tokens of
context, on its own pages), in one process:

* **step**: a whole greedy decode step as the engine runs it
  (``Runner.execute``: host preparation, host->device copy, the model, the
  sampler, device->host copy);
* **model**: the jitted forward + logits of the step (KV pool donated);
  **no attention**: the same with attention replaced by the identity;
  attention = model - no attention; **attention alone**: the kernel called
  once per layer on the runner's page pools, by itself;
* **LM head**: the model's ``compute_logits`` on R hidden rows, alone;
* **KV write**: ``write_kv`` of R tokens into a page pool, once per layer;
* **sampling**: the sampler on R rows of logits, greedy and top-p 0.95;
* **matmul floor**: the same-shape matmul chain (every layer's qkv, o,
  gate/up and down projections, then the LM head) on random weights, with
  XLA's dot and with the C++ kernel (kernels_pallas/cpu/matmul.cc); the floor
  is the faster of the two, per part;
* **layer matmuls**: every layer's projections chained alone on the model's own
  weights (float32, or ``--quantization gguf|int8``'s kept quantized) through the
  path the runner uses at R rows;
* derived: **norms/rotary/elementwise** = no attention - layer matmuls - LM
  head - KV write; **dispatch/transfer/host** = step - model - greedy sampling.

Each figure is the median of ``--reps`` calls, then the median over
``--rounds`` rounds that alternate the step's parts and the floor (the
machine's speed drifts). The step is quoted as a multiple of the floor, the
median of the rounds' own ratios with their range (the issue's goal: within
1.4x at 64 and 128 rows).
Prints a table and writes JSON (default benchmarks/results/step_profile.json).
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
from benchmarks.kernel_bench.sampler import _median_ms  # noqa: E402
from pagedjax.benchmarks.throughput import write_json  # noqa: E402

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                            "step_profile.json")


def _rows(n: int, context: int, page_size: int):
    from pagedjax.core.scheduler import ScheduledRow

    per = -(-context // page_size)
    return [ScheduledRow(f"r{i}", [1], context - 1, list(range(1 + i * per, 1 + (i + 1) * per)))
            for i in range(n)]


def matmul_floor(shapes: dict, rows: int, reps: int) -> dict:
    """Layer matmuls and the LM head on random weights of the model's shapes, XLA and C++."""
    import jax
    import jax.numpy as jnp

    from pagedjax.kernels_pallas.cpu import native as cpu_native

    rng = np.random.default_rng(0)
    h, inter, qkv, o_in, layers, vocab = (shapes[k] for k in (
        "hidden", "intermediate", "qkv", "o_in", "layers", "vocab"))

    def w(*shape):
        return jnp.asarray(rng.standard_normal(shape, np.float32) * 0.05)

    ws = [(w(h, qkv), w(o_in, h), w(h, 2 * inter), w(inter, h)) for _ in range(layers)]
    emb = w(vocab, h)

    def chain(mm):
        def f(x, ws):
            for a, b, c, d in ws:
                q = mm(x, a)
                x = x + mm(q[:, :o_in], b) * 0.01
                gu = mm(x, c)
                x = x + mm(gu[:, :inter] * gu[:, inter:], d) * 0.01
            return x
        return jax.jit(f)

    x = jnp.asarray(rng.standard_normal((rows, h), np.float32))
    xla_chain, xla_head = chain(lambda a, b: a @ b), jax.jit(lambda x, e: x @ e.T)
    out = {"layers_xla_ms": _median_ms(lambda: xla_chain(x, ws).block_until_ready(), reps),
           "lm_head_xla_ms": _median_ms(lambda: xla_head(x, emb).block_until_ready(), reps)}
    if cpu_native.available() and cpu_native.fast_matmul():
        cpp_chain = chain(cpu_native.matmul)
        cpp_head = jax.jit(lambda x, e: cpu_native.matmul(x, e, transposed=True))
        out["layers_cpp_ms"] = _median_ms(lambda: cpp_chain(x, ws).block_until_ready(), reps)
        out["lm_head_cpp_ms"] = _median_ms(lambda: cpp_head(x, emb).block_until_ready(), reps)
    out["layers_floor_ms"] = min(v for k, v in out.items() if k.startswith("layers_"))
    out["lm_head_floor_ms"] = min(v for k, v in out.items() if k.startswith("lm_head_"))
    out["floor_ms"] = out["layers_floor_ms"] + out["lm_head_floor_ms"]
    return out


def model_matmuls_ms(runner, rows: int, reps: int) -> float | None:
    """The layer matmuls alone on the model's own weights (float or quantized, through
    the path the plan picks at ``rows`` rows): every layer's qkv, o, gate/up and down
    projections chained; None for a model whose layers lack them (e.g. mixture of experts)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from pagedjax.models import nn

    model = nnx.merge(runner.model.graphdef, runner.params)
    try:
        ws = [(m.attn.qkv_proj.kernel, m.attn.o_proj.kernel, m.mlp.gate_up.kernel,
               m.mlp.down.kernel) for m in model.layers]
    except AttributeError:
        return None
    plan, h = runner.plan, runner.model.info.hidden_size

    @jax.jit
    def chain(x):
        for qkv, o, gu, down in ws:
            q = nn.qmatmul(x, qkv, plan).reshape(rows, -1)
            x = x + nn.qmatmul(q[:, :o.shape[0]], o, plan) * 0.01
            g = nn.qmatmul(x, gu, plan).reshape(rows, 2, -1)
            x = x + nn.qmatmul(g[:, 0] * g[:, 1], down, plan) * 0.01
        return x

    x = jnp.asarray(np.random.default_rng(3).standard_normal((rows, h), np.float32))
    return _median_ms(lambda: chain(x).block_until_ready(), reps)


def model_step_fns(runner):
    """(full, no-attention) jitted model parts of a step, each traced with its own
    execution plan: the runner's, and the runner's with attention replaced by identity."""
    import dataclasses

    import jax

    model = runner.model

    def step_fn(plan):
        def f(params, kv, batch):
            hidden, kv = model.forward(params, kv, batch.token_ids, batch.meta, plan)
            logits = model.compute_logits(params, hidden[batch.logits_index], plan)
            return logits, kv
        return jax.jit(f, donate_argnums=(1,))

    def no_attention(q, *args, **kwargs):  # [T, Hq, D] in, [T, Hq, D] out
        return q

    return step_fn(runner.plan), step_fn(dataclasses.replace(runner.plan,
                                                             attention_fn=no_attention))


def attention_direct_ms(runner, rows: int, context: int, reps: int) -> float:
    """The step's attention measured alone: every layer's kernel call on the runner's
    own page pools (one per layer, so the keys come from memory as in a step), the
    rows' pages laid out as ``_rows`` lays them out."""
    import jax
    import jax.numpy as jnp

    from pagedjax.kernels_pallas.cpu import native as cpu_native
    from pagedjax.kernels_pallas import reference

    info, ps = runner.model.info, runner.page_size
    per = -(-context // ps)
    table = jnp.asarray(1 + np.arange(rows * per, dtype=np.int32).reshape(rows, per))
    kv_lens = jnp.full((rows,), context, jnp.int32)
    cu = jnp.arange(rows + 1, dtype=jnp.int32)
    q = jnp.asarray(np.random.default_rng(2).standard_normal(
        (rows, info.num_q_heads, info.head_dim)), jnp.float32)
    attend = (cpu_native.ragged_paged_attention if runner.attn_backend == "cpu_native"
              else reference.ragged_paged_attention)

    @jax.jit
    def layers(q, pools):
        for pages, scales in pools:  # each layer's output feeds the next: calls run in turn
            q = attend(q, pages, kv_lens, table, cu, jnp.int32(rows),
                       sm_scale=info.head_dim ** -0.5, max_q_len=1, kv_scales=scales)
        return q

    pools = [(pages, scales) for pages, scales in runner.kv_caches]
    return _median_ms(lambda: layers(q, pools).block_until_ready(), reps)


def parts(runner, rows: int, context: int, reps: int) -> dict:
    """The model-side parts of a decode step of ``rows`` rows (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from pagedjax.kernels_pallas import write_kv
    from pagedjax.worker.inputs import SampleRow
    from pagedjax.sample.sampler import RowState, build_sampling_tensors, sample_jit
    from pagedjax.sampling_params import SamplingParams

    sched = _rows(rows, context, runner.page_size)
    greedy = SamplingParams(temperature=0.0)
    srows = [SampleRow(r.request_id, i, RowState(greedy, [1], []), None)
             for i, r in enumerate(sched)]
    res = {"rows": rows, "context": context,
           "step_ms": _median_ms(lambda: runner.execute(sched, srows), reps)}
    batch = jax.device_put(runner.prepare(sched, [], {}, {})[0])
    full, bare = model_step_fns(runner)

    def run(fn):
        logits, runner.kv_caches = fn(runner.params, runner.kv_caches, batch)
        jax.block_until_ready(logits)

    res["model_ms"] = _median_ms(lambda: run(full), reps)
    res["no_attention_ms"] = _median_ms(lambda: run(bare), reps)
    res["attention_direct_ms"] = attention_direct_ms(runner, rows, context, reps)
    res["model_matmuls_ms"] = model_matmuls_ms(runner, rows, reps)
    info = runner.model.info
    hid = jnp.asarray(np.random.default_rng(0).standard_normal((rows, info.hidden_size)),
                      info.dtype)
    logits_fn = jax.jit(lambda params, h: runner.model.compute_logits(params, h, runner.plan))
    res["lm_head_ms"] = _median_ms(lambda: logits_fn(runner.params, hid).block_until_ready(), reps)

    pages = jnp.zeros((rows * -(-context // 16) + 1, 2, info.num_kv_heads, 16, info.head_dim),
                      jnp.float32)
    kv = jnp.ones((rows, info.num_kv_heads, info.head_dim), jnp.float32)
    slots = jnp.asarray(np.arange(rows) * (-(-context // 16)) * 16 + 16 + (context - 1) % 16,
                        jnp.int32)

    @jax.jit
    def writes(p, k):
        for i in range(info.num_layers):
            p = write_kv(p, None, k + i, k - i, slots)[0]
        return p

    res["kv_write_ms"] = _median_ms(lambda: writes(pages, kv).block_until_ready(), reps)
    logits = jnp.asarray(np.random.default_rng(1).standard_normal((rows, info.vocab_size)) * 3,
                         jnp.float32)
    for name, kw in (("greedy", dict(temperature=0.0)), ("top_p", dict(temperature=0.8,
                                                                      top_p=0.95))):
        st = jax.device_put(build_sampling_tensors(
            [RowState(SamplingParams(**kw), [1], [], fallback_seed=i) for i in range(rows)],
            rows, info.vocab_size, 8))
        res[f"sample_{name}_ms"] = _median_ms(
            lambda: jax.block_until_ready(sample_jit(logits, st)), reps)
    return res


def median_of(results: list[dict]) -> dict:
    """Per key, the median over rounds (values the rounds agree on, such as the row
    count, and non-numeric ones: the first round's)."""
    out = {}
    for k, v in results[0].items():
        vals = [x[k] for x in results]
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        out[k] = float(np.median(vals)) if numeric and len(set(vals)) > 1 else v
    return out


def derive(p: dict, floor: dict, native_rows: int) -> dict:
    """Attention, elementwise and dispatch by difference; the step against the floor."""
    used = "layers_cpp_ms" if p["rows"] <= native_rows and "layers_cpp_ms" in floor \
        else "layers_xla_ms"
    own = p.get("model_matmuls_ms")  # the model's own weights (quantized ones included)
    layers = own if own is not None else floor[used]
    d = {"layers_matmul_ms": layers, "layers_matmul_path": "model" if own is not None else used[7:10],
         "attention_ms": p["model_ms"] - p["no_attention_ms"],
         "elementwise_ms": p["no_attention_ms"] - layers - p["lm_head_ms"] - p["kv_write_ms"],
         "dispatch_host_ms": p["step_ms"] - p["model_ms"] - p["sample_greedy_ms"],
         "step_over_floor": p["step_ms"] / floor["floor_ms"],
         "floor_tok_s": 1000 * p["rows"] / floor["floor_ms"],
         "step_tok_s": 1000 * p["rows"] / p["step_ms"]}
    return d


COLUMNS = [("step", "step_ms"), ("model", "model_ms"), ("attn", "attention_ms"),
           ("attn alone", "attention_direct_ms"),
           ("layer mm", "layers_matmul_ms"), ("LM head", "lm_head_ms"), ("KV write", "kv_write_ms"),
           ("elemwise", "elementwise_ms"), ("greedy", "sample_greedy_ms"),
           ("top-p", "sample_top_p_ms"), ("host/disp", "dispatch_host_ms"), ("floor", "floor_ms")]


def print_table(report: dict) -> None:
    print(f"\ndecode step at {report['context']} tokens of context, weights "
          f"{report['quantization']} ({report['weight_bytes'] / 2**20:.1f} MiB), "
          f"layer mm: the model's own weights; ms (median of "
          f"{report['args']['reps']} calls, median over {report['args']['rounds']} rounds); "
          f"floor = layer matmuls + LM head, the faster of XLA and C++; step/floor: the "
          f"median of the rounds' own ratios [lowest - highest]")
    hdr = f"{'rows':>5} " + " ".join(f"{c:>9}" for c, _ in COLUMNS) + f" {'step/floor':>10}"
    print(hdr)
    print("-" * len(hdr))
    for r in report["steps"]:
        rr = r["step_over_floor_rounds"]
        print(f"{r['rows']:>5} " + " ".join(f"{r[k]:>9.1f}" for _, k in COLUMNS)
              + f" {r['step_over_floor']:>9.2f}x [{min(rr):.2f}-{max(rr):.2f}]")
    print("matmul floor parts (ms): " + "; ".join(
        f"{r['rows']} rows: layers XLA {r['floor']['layers_xla_ms']:.1f}"
        + (f" / C++ {r['floor']['layers_cpp_ms']:.1f}" if "layers_cpp_ms" in r["floor"] else "")
        + f", LM head XLA {r['floor']['lm_head_xla_ms']:.1f}"
        + (f" / C++ {r['floor']['lm_head_cpp_ms']:.1f}" if "lm_head_cpp_ms" in r["floor"] else "")
        for r in report["steps"]))
    print(f"machine: {machine.describe(report['machine'])}; load at the end "
          f"{report['machine']['loadavg_end']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rows", default="16,64,128,256", help="decode row counts")
    p.add_argument("--context", type=int, default=192, help="tokens of context per row")
    p.add_argument("--reps", type=int, default=5, help="calls per figure per round")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds alternating the step's parts and the floor")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's), int8, fp8")
    p.add_argument("--quantization", default="none",
                   help="the model's weights: none (float32; a GGUF file dequantized at load), "
                        "gguf (the file's blocks, the C++ block kernel), int8; the floor stays "
                        "the float32 matmuls'")
    p.add_argument("--json", default=DEFAULT_JSON)
    return p.parse_args(argv)


def main(argv=None) -> int:
    ns = parse_args(argv)
    import jax

    from pagedjax.models import resolve_model
    from pagedjax import LLM

    rows_list = [int(x) for x in ns.rows.split(",")]
    s_max = max(rows_list)
    per = -(-ns.context // 16)
    llm = LLM(model=ns.model, max_model_len=ns.context + 16, max_num_seqs=s_max,
              attention_backend=ns.attention_backend, kv_cache_dtype=ns.kv_cache_dtype,
              num_pages=s_max * per + 8, quantization=ns.quantization)
    runner = llm.llm_engine.runner
    info, cfg = runner.model.info, resolve_model(ns.model).hf_config
    shapes = {"hidden": info.hidden_size, "intermediate": int(cfg["intermediate_size"]),
              "qkv": (info.num_q_heads + 2 * info.num_kv_heads) * info.head_dim,
              "o_in": info.num_q_heads * info.head_dim, "layers": info.num_layers,
              "vocab": info.vocab_size}
    native_rows = runner.plan.native_matmul_rows
    report = {"benchmark": "step_profile", "args": vars(ns),
              "kv_cache_dtype": str(runner.kv_caches[0][0].dtype), "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": machine.machine(), "jax_backend": jax.default_backend(),
              "attention_backend": runner.attn_backend, "native_matmul_max_rows": native_rows,
              "quantization": ns.quantization, "weight_bytes": llm.llm_engine.weight_bytes,
              "block_matmul_rows": runner.plan.block_matmul_rows,
              "context": ns.context, "shapes": shapes, "steps": []}
    for r in rows_list:
        # Rounds alternate the step's parts and the floor, so a drift of the machine's
        # speed during the run moves both (each round's own step / floor is kept).
        ps, fs = [], []
        for k in range(ns.rounds):
            print(f"{r} rows, round {k + 1}/{ns.rounds} ...", flush=True)
            ps.append(parts(runner, r, ns.context, ns.reps))
            fs.append(matmul_floor(shapes, r, ns.reps))
        p, floor = median_of(ps), median_of(fs)
        p.update(floor_ms=floor["floor_ms"], floor=floor, **derive(p, floor, native_rows))
        p["step_over_floor_rounds"] = [a["step_ms"] / b["floor_ms"] for a, b in zip(ps, fs)]
        p["step_over_floor"] = float(np.median(p["step_over_floor_rounds"]))
        report["steps"].append(p)
    report["machine"]["loadavg_end"] = machine.loadavg()
    print_table(report)
    write_json(report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
