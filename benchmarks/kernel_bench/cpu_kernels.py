"""The C++ CPU kernels (kernels_pallas/cpu/attention.cc, cpu_matmul.cc) vs XLA on the same inputs.

Attention: one layer with SmolLM2-135M's heads (9 q / 3 kv, head_dim 64,
16-token pages placed at random) for 1, 8 and 64 decode rows and a 512-token
prefill (8 chunks of 64); ``--attention-rows`` instead: a 30-layer decode step's
attention at several row counts (how it scales with rows). Matmuls: 30 SmolLM2-sized layers (qkv, o, gate_up,
down) plus the tied-embedding logits, at 1..128 rows. ``--int8``: the same 30 layers
and logits with int8 weights (kernels_pallas/cpu/qmatmul.cc) beside float32, each
in C++ and in XLA (int8 in XLA: models/quant.py's chunked dequantization, the
model's path without the kernel), cases alternating order between rounds.
``--blocks``: the same 30 layers as GGUF Q4_1 blocks and the tied logits as Q8_0
through the C++ block kernel (kernels_pallas/cpu/blockmatmul.cc) against the same
weights dequantized to float32 on XLA's matmul and the C++ float matmul, layers
and logits timed apart, 1 to 2048 rows, cases alternating order between rounds
(``--block-builds native,avx2``: also the kernel's AVX2 + FMA build, as a CPU without
AVX-512 runs it). Each
figure is the minimum of ``--reps`` runs of a jitted call. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pagedjax.benchmarks.throughput import write_json  # noqa: E402
from pagedjax.kernels_pallas.cpu import (blockmatmul as cpu_blockmatmul, native as cpu_native,  # noqa: E402
                                         qmatmul as cpu_qmatmul)
from pagedjax.kernels_pallas import reference  # noqa: E402
from pagedjax.models import quant as Q  # noqa: E402

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "cpu_kernels.json")
INT8_JSON = DEFAULT_JSON.replace("cpu_kernels.json", "cpu_kernels_int8.json")
BLOCKS_JSON = DEFAULT_JSON.replace("cpu_kernels.json", "cpu_kernels_blocks.json")


def _best_ms(f, args, reps):
    f(*args).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(*args).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 1000 * best


def _attention_case(q_lens, kv_lens, hkv=3, g=3, d=64, ps=16, pages=64, seed=0):
    rng = np.random.default_rng(seed)
    s, t = len(q_lens), int(sum(q_lens))
    n = s * pages + 1
    table = np.zeros((s, pages), np.int32)
    perm = rng.permutation(np.arange(1, n))
    for i, kl in enumerate(kv_lens):
        table[i, : -(-kl // ps)] = perm[i * pages: i * pages + -(-kl // ps)]
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return [jnp.asarray(x) for x in (
        rng.standard_normal((t, hkv * g, d), np.float32),
        rng.standard_normal((n, 2, hkv, ps, d), np.float32),
        np.asarray(kv_lens, np.int32), table, cu, np.asarray([s], np.int32))]


def attention(reps):
    rng = np.random.default_rng(1)
    cases = {"decode 1 row": ([1], [192], 1), "decode 8 rows": ([1] * 8, [192] * 8, 1),
             "decode 64 rows": ([1] * 64, list(rng.integers(20, 340, 64)), 1),
             "prefill 512 tokens": ([64] * 8, [64 * (i + 1) for i in range(8)], None)}
    out = []
    for name, (ql, kl, mq) in cases.items():
        args = _attention_case(ql, kl)
        fn = jax.jit(lambda *a, mq=mq: cpu_native.ragged_paged_attention(*a, sm_scale=0.125, max_q_len=mq))
        fx = jax.jit(lambda *a, mq=mq: reference.ragged_paged_attention(*a, sm_scale=0.125, max_q_len=mq))
        err = float(jnp.linalg.norm(fn(*args) - fx(*args)) / jnp.linalg.norm(fx(*args)))
        out.append({"case": name, "cpu_native_ms": _best_ms(fn, args, reps),
                    "xla_ms": _best_ms(fx, args, reps), "rel_err": err})
    return out


def _quantized_pools(pool, layers, kv_dtype):
    """``layers`` distinct page pools of ``kv_dtype`` (f32, bf16, int8, fp8) and their scales."""
    out = []
    for i in range(layers):
        p = pool + 0.01 * i
        if kv_dtype in ("f32", "bf16"):
            out.append((p.astype(jnp.float32 if kv_dtype == "f32" else jnp.bfloat16), None))
            continue
        top, dt = (127.0, jnp.int8) if kv_dtype == "int8" else (448.0, jnp.float8_e4m3fn)
        sc = jnp.max(jnp.abs(p), axis=-1) / top
        v = p / sc[..., None]
        out.append(((jnp.round(v) if kv_dtype == "int8" else v).astype(dt), sc))
    return out


def attention_scaling(reps, rows, kv_dtypes=("f32",), layers=30, context=192, rounds=3):
    """Decode attention of a whole step: ``layers`` kernel calls, each on its own page pool
    (so the keys come from memory, as in a model), every row one token at ``context``;
    cases alternate order between rounds. Per row count and page dtype: best ms, ms per
    row, and the keys and values read per second."""
    fn = jax.jit(lambda q, pools, *a: _chain(q, pools, a))
    cases = {}
    for r in rows:
        q, pool, *rest = _attention_case([1] * r, [context] * r, pages=-(-context // 16))
        for dt in kv_dtypes:
            cases[r, dt] = (q, _quantized_pools(pool, layers, dt), *rest)
            fn(*cases[r, dt]).block_until_ready()
    best = {k: float("inf") for k in cases}
    for k in range(rounds):
        for key in (list(cases) if k % 2 == 0 else list(cases)[::-1]):
            best[key] = min(best[key], _best_ms(fn, cases[key], reps))
    size = {"f32": 4, "bf16": 2, "int8": 1, "fp8": 1}
    return [{"rows": r, "kv_dtype": dt, "layers": layers, "context": context, "ms": best[r, dt],
             "ms_per_row": best[r, dt] / r,  # K and V of 3 heads x 64 dims per token and layer
             "kv_gb_s": r * 2 * 3 * 64 * size[dt] * context * layers / best[r, dt] / 1e6}
            for r, dt in cases]


def _chain(q, pools, args):
    for pool, scales in pools:  # each layer's output is the next one's q: the calls run in turn
        q = cpu_native.ragged_paged_attention(q, pool, *args, sm_scale=0.125, max_q_len=1,
                                              kv_scales=scales)
    return q


def matmuls(reps, rows):
    rng = np.random.default_rng(0)
    h, inter, vocab, qkv, layers = 576, 1536, 49152, 960, 30

    def w(*shape):
        return jnp.asarray(rng.standard_normal(shape, np.float32) * 0.05)

    ws = [(w(h, qkv), w(h, h), w(h, 2 * inter), w(inter, h)) for _ in range(layers)]
    emb = w(vocab, h)

    model = _layers_model
    fx = model(lambda x, w: x @ w, lambda x, e: x @ e.T)
    fn = model(cpu_native.matmul, lambda x, e: cpu_native.matmul(x, e, transposed=True))
    out = []
    for m in rows:
        x = jnp.asarray(rng.standard_normal((m, h), np.float32))
        a, b = fx(x, ws, emb), fn(x, ws, emb)
        out.append({"rows": m, "cpu_native_ms": _best_ms(fn, (x, ws, emb), reps),
                    "xla_ms": _best_ms(fx, (x, ws, emb), reps),
                    "rel_err": float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a))})
    return out


def _layers_model(mm, mm_t, h=576, inter=1536):
    """30 SmolLM2-sized layers and the tied logits, ``mm(x, w)`` / ``mm_t(x, emb)`` the
    products (each weight a float array or an int8 (q, scale) pair)."""
    def f(x, ws, emb):
        for a, b, c, d in ws:
            q = mm(x, a)
            x = x + mm(x, b) * 0.01 + q[:, :h] * 0.01
            gu = mm(x, c)
            x = x + mm(jax.nn.silu(gu[:, :inter]) * gu[:, inter:], d) * 0.01
        return mm_t(x, emb)
    return jax.jit(f)


def _int8(w, axis):
    c = Q.quantize_int8(np.asarray(w), axis)
    return jnp.asarray(c["q"]), jnp.asarray(c["scale"])


def int8_matmuls(reps, rows, rounds=3):
    """Best ms of a 30-layer decode step's matmuls + logits: float32 and int8 weights,
    C++ and XLA, at each row count; the four cases alternate order between rounds."""
    rng = np.random.default_rng(0)
    h, inter, vocab, qkv, layers = 576, 1536, 49152, 960, 30

    def w(*shape):
        return rng.standard_normal(shape, np.float32) * 0.05

    host = [(w(h, qkv), w(h, h), w(h, 2 * inter), w(inter, h)) for _ in range(layers)]
    emb = w(vocab, h)
    f32 = ([tuple(jnp.asarray(a) for a in ly) for ly in host], jnp.asarray(emb))
    i8 = ([tuple(_int8(a, 0) for a in ly) for ly in host], _int8(emb, -1))
    del host

    def xla_i8(x, c):
        return Q.chunked_matmul("int8", {"q": c[0], "scale": c[1]}, x, lambda a, b: a @ b)

    def xla_i8_t(x, c):
        return Q.chunked_matmul_t("int8", {"q": c[0], "scale": c[1]}, x, lambda a, b: a @ b.T)

    fns = {
        ("float32", "C++"): (_layers_model(cpu_native.matmul, lambda x, e: cpu_native.matmul(
            x, e, transposed=True)), f32),
        ("float32", "XLA"): (_layers_model(lambda x, w: x @ w, lambda x, e: x @ e.T), f32),
        ("int8", "C++"): (_layers_model(lambda x, c: cpu_qmatmul.qmatmul(x, *c), lambda x, c:
                                        cpu_qmatmul.qmatmul(x, *c, transposed=True)), i8),
        ("int8", "XLA"): (_layers_model(xla_i8, xla_i8_t), i8),
    }
    best, ref = {}, {}
    xs = {m: jnp.asarray(rng.standard_normal((m, h), np.float32)) for m in rows}
    for m in rows:
        for key, (f, (ws, e)) in fns.items():
            ref[m, key] = np.asarray(f(xs[m], ws, e))  # compiles
            best[m, key] = float("inf")
    for k in range(rounds):
        for m in rows:
            for key in (list(fns) if k % 2 == 0 else list(fns)[::-1]):
                f, (ws, e) = fns[key]
                best[m, key] = min(best[m, key], _best_ms(f, (xs[m], ws, e), reps))
    out = []
    for m in rows:
        for key in fns:
            base = ref[m, (key[0], "XLA")]
            out.append({"rows": m, "weights": key[0], "kernel": key[1], "ms": best[m, key],
                        "rel_err_vs_xla": float(np.linalg.norm(ref[m, key] - base)
                                                / np.linalg.norm(base))})
    return out


def int8_model_steps(reps, rows, rounds=3, context=64):
    """SmolLM2-135M loaded int8: best ms of a decode step (forward + logits, cpu_native
    attention, every row one token at ``context``) with the int8 matmuls in C++
    (plan.native_matmul_rows = rows) vs on XLA's path (0); alternating order."""
    import pagedjax.models as models
    from pagedjax.models.base import ExecutionPlan
    from pagedjax.models.metadata import SeqChunk, build_metadata

    m, p = models.load_model(None, dtype="float32", quantization="int8")
    ps, per = 16, -(-context // 16)
    cases, out = {}, []
    for r in rows:
        meta = build_metadata([SeqChunk(list(range(1 + i * per, 1 + (i + 1) * per)),
                                        context - 1, 1) for i in range(r)], ps, pages_per_seq=per)
        kv = m.allocate_kv_caches(r * per + 1, ps)
        for kernel, limit in (("C++", r), ("XLA", 0)):
            plan = ExecutionPlan(attn_backend="cpu_native", native_matmul_rows=limit)

            def step(p, kv, ids, meta, plan=plan):
                h, _ = m.forward(p, kv, ids, meta, plan)
                return m.compute_logits(p, h, plan)
            cases[r, kernel] = (jax.jit(step), (p, kv, jnp.ones((r,), jnp.int32), meta))
    logits = {k: np.asarray(f(*a)) for k, (f, a) in cases.items()}  # compiles
    best = {k: float("inf") for k in cases}
    for i in range(rounds):
        for k in (list(cases) if i % 2 == 0 else list(cases)[::-1]):
            f, a = cases[k]
            best[k] = min(best[k], _best_ms(f, a, reps))
    for (r, kernel) in cases:
        ref = logits[r, "XLA"]
        out.append({"rows": r, "kernel": kernel, "ms": best[r, kernel],
                    "max_abs_logit_diff_vs_xla": float(np.abs(logits[r, kernel] - ref).max())})
    return out


def _random_blocks(rng, kind, shape, transposed):
    """Random components of a GGUF ``kind`` weight (codes of every value, small positive
    float16 scales; q4_1's offsets -8 scales, so the values centre on zero) in
    models/quant.py's layout: ``shape`` [K, N], quantized along K (``transposed``: the
    table [N, K], its rows quantized)."""
    k, n = shape[::-1] if transposed else shape
    out = {}
    for name, cshape in cpu_blockmatmul.component_shapes(kind, k, n, transposed).items():
        dt = np.dtype(Q.component_dtypes(kind)[name])
        out[name] = (rng.random(cshape) * 0.01 + 0.001).astype(dt) if dt.kind == "f" \
            else rng.integers(0, 256, cshape).astype(dt)
    if "m" in out:
        out["m"] = (-8 * out["d"].astype(np.float32)).astype(out["m"].dtype)
    return {name: jnp.asarray(v) for name, v in out.items()}


# --block-builds: the block kernel's build paths (blockmatmul.build_target's flags; native:
# the build the models use)
BLOCK_BUILDS = {"native": None, "avx2": ["-O3", "-mavx2", "-mfma", "-mf16c"], "portable": ["-O3"]}


def block_matmuls(reps, rows, rounds=3, builds=("native",)):
    """Best ms of a 30-layer decode step's matmuls (Q4_1) and of the tied logits (Q8_0):
    the C++ block kernel on the blocks (each of ``builds``: "blocks C++" the models'
    build, "blocks avx2" / "blocks portable" that build path's), and the same weights
    dequantized to float32 on XLA's matmul and on the C++ float matmul, at each row
    count; cases alternate order."""
    rng = np.random.default_rng(0)
    h, inter, vocab, qkv, layers = 576, 1536, 49152, 960, 30
    shapes = ((h, qkv), (h, h), (h, 2 * inter), (inter, h))
    blocks = [tuple(_random_blocks(rng, "q4_1", s, False) for s in shapes) for _ in range(layers)]
    table = _random_blocks(rng, "q8_0", (vocab, h), True)
    f32 = [tuple(Q.dequantize("q4_1", c, 0, jnp.float32) for c in ly) for ly in blocks]
    emb = Q.dequantize("q8_0", table, -1, jnp.float32)

    def layers_only(mm):
        return _layers_model(mm, lambda x, e: x)

    def logits_only(mm_t):
        return jax.jit(lambda x, e: mm_t(x, e))

    fns = {}
    for part in ("layers", "logits"):
        for b in builds:
            t = None if BLOCK_BUILDS[b] is None else cpu_blockmatmul.build_target(BLOCK_BUILDS[b])
            name = "blocks C++" if b == "native" else f"blocks {b}"
            if part == "layers":
                fns[part, name] = (layers_only(lambda x, c, t=t: cpu_blockmatmul.blockmatmul(
                    "q4_1", c, x, target=t)), blocks)
            else:
                fns[part, name] = (logits_only(lambda x, c, t=t: cpu_blockmatmul.blockmatmul(
                    "q8_0", c, x, transposed=True, target=t)), table)
        if part == "layers":
            fns[part, "float32 XLA"] = (layers_only(lambda x, w: x @ w), f32)
            fns[part, "float32 C++"] = (layers_only(cpu_native.matmul), f32)
        else:
            fns[part, "float32 XLA"] = (logits_only(lambda x, e: x @ e.T), emb)
            fns[part, "float32 C++"] = (logits_only(lambda x, e: cpu_native.matmul(
                x, e, transposed=True)), emb)
    xs = {m: jnp.asarray(rng.standard_normal((m, h), np.float32)) for m in rows}
    best, ref = {}, {}
    for m in rows:
        for key, (f, a) in fns.items():
            args = (xs[m], a, None) if key[0] == "layers" else (xs[m], a)
            ref[m, key] = np.asarray(f(*args))  # compiles
            best[m, key] = float("inf")
    for k in range(rounds):
        for m in rows:
            for key in (list(fns) if k % 2 == 0 else list(fns)[::-1]):
                f, a = fns[key]
                args = (xs[m], a, None) if key[0] == "layers" else (xs[m], a)
                best[m, key] = min(best[m, key], _best_ms(f, args, reps))
    out = []
    for m in rows:
        for key in fns:
            base = ref[m, (key[0], "float32 XLA")]
            out.append({"rows": m, "part": key[0], "path": key[1], "ms": best[m, key],
                        "vs_float32_xla": best[m, (key[0], "float32 XLA")] / best[m, key],
                        "rel_err_vs_xla": float(np.linalg.norm(ref[m, key] - base)
                                                / np.linalg.norm(base))})
    return out


def _print_blocks(rows):
    print(f"{'rows':>6}{'part':>8}{'path':>16}{'ms':>9}{'XLA f32 / this':>16}{'rel err':>10}")
    for r in rows:
        print(f"{r['rows']:>6}{r['part']:>8}{r['path']:>16}{r['ms']:>9.2f}"
              f"{r['vs_float32_xla']:>15.2f}x{r['rel_err_vs_xla']:>10.1e}")


def _print_int8(rows):
    print(f"{'30 layers + logits':<20}{'weights':>9}{'kernel':>8}{'ms':>9}"
          f"{'vs f32 XLA':>12}{'rel err':>10}")
    base = {r["rows"]: r["ms"] for r in rows if r["weights"] == "float32" and r["kernel"] == "XLA"}
    for r in rows:
        print(f"{str(r['rows']) + ' rows':<20}{r['weights']:>9}{r['kernel']:>8}{r['ms']:>9.1f}"
              f"{base[r['rows']] / r['ms']:>11.2f}x{r['rel_err_vs_xla']:>10.1e}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rows", default=None,
                   help="matmul row counts (default 1,2,4,8,16,32,64,128; --blocks: "
                        "1,16,64,256,2048)")
    p.add_argument("--attention-rows", default="",
                   help="only the decode attention of a 30-layer step at these row counts "
                        "(e.g. 16,64,128,256)")
    p.add_argument("--attention-kv-dtypes", default="f32",
                   help="page dtypes for --attention-rows (f32,bf16,int8,fp8)")
    p.add_argument("--json", default=None,
                   help=f"default {DEFAULT_JSON} (--int8: {INT8_JSON})")
    p.add_argument("--int8", action="store_true",
                   help="only the matmuls with int8 weights beside float32 (C++ and XLA)")
    p.add_argument("--blocks", action="store_true",
                   help="only the matmuls with GGUF blocks (C++ block kernel) beside float32 "
                        "(rows default 1,16,64,256,2048)")
    p.add_argument("--block-builds", default="native",
                   help="--blocks: the block kernel's build paths to time, of "
                        f"{','.join(BLOCK_BUILDS)} (native: the models' build)")
    p.add_argument("--int8-model", action="store_true",
                   help="only SmolLM2-135M int8 decode steps, int8 matmuls in C++ vs XLA")
    ns = p.parse_args(argv)
    rows = ns.rows or "1,2,4,8,16,32,64,128"
    if not cpu_native.available():
        raise SystemExit(f"cpu_native is unavailable: {cpu_native.unavailable_reason()}")
    if ns.int8_model:
        steps = int8_model_steps(ns.reps, [int(x) for x in rows.split(",")])
        print(f"{'int8 decode step':<18}{'matmuls':>8}{'ms':>9}{'max |logit diff|':>18}")
        for r in steps:
            print(f"{str(r['rows']) + ' rows':<18}{r['kernel']:>8}{r['ms']:>9.1f}"
                  f"{r['max_abs_logit_diff_vs_xla']:>18.2e}")
        write_json({"benchmark": "cpu_kernels_int8_model_steps", "jax": jax.__version__,
                    "loadavg": os.getloadavg(), "steps": steps},
                   ns.json or INT8_JSON.replace(".json", "_model.json"))
        return 0
    if ns.blocks:
        if not cpu_blockmatmul.available():
            raise SystemExit(f"cpu_blockmatmul: {cpu_blockmatmul.unavailable_reason()}")
        builds = ns.block_builds.split(",")
        if not set(builds) <= set(BLOCK_BUILDS):
            raise SystemExit(f"--block-builds: {ns.block_builds!r}: each one of {list(BLOCK_BUILDS)}")
        rows = block_matmuls(ns.reps, [int(x) for x in (ns.rows or "1,16,64,256,2048").split(",")],
                             builds=builds)
        _print_blocks(rows)
        write_json({"benchmark": "cpu_kernels_block_matmuls", "jax": jax.__version__,
                    "loadavg": os.getloadavg(), "block_matmuls": rows}, ns.json or BLOCKS_JSON)
        return 0
    if ns.int8:
        if not cpu_qmatmul.available():
            raise SystemExit(f"cpu_qmatmul is unavailable: {cpu_qmatmul.unavailable_reason()}")
        rows = int8_matmuls(ns.reps, [int(x) for x in rows.split(",")])
        _print_int8(rows)
        write_json({"benchmark": "cpu_kernels_int8_matmuls", "jax": jax.__version__,
                    "loadavg": os.getloadavg(), "int8_matmuls": rows}, ns.json or INT8_JSON)
        return 0
    if ns.attention_rows:
        sc = attention_scaling(ns.reps, [int(x) for x in ns.attention_rows.split(",")],
                               ns.attention_kv_dtypes.split(","))
        print(f"{'decode attention':<18}{'pages':>6}{'ms (30 layers)':>15}{'ms per row':>12}"
              f"{'KV GB/s':>9}")
        for r in sc:
            print(f"{str(r['rows']) + ' rows':<18}{r['kv_dtype']:>6}{r['ms']:>15.1f}"
                  f"{r['ms_per_row']:>12.3f}{r['kv_gb_s']:>9.1f}")
        write_json({"benchmark": "cpu_kernels_attention_scaling", "jax": jax.__version__,
                    "attention_scaling": sc}, ns.json or DEFAULT_JSON)
        return 0
    att = attention(ns.reps)
    print(f"{'attention, one layer':<24}{'cpu_native ms':>14}{'xla ms':>10}{'rel err':>10}")
    for r in att:
        print(f"{r['case']:<24}{r['cpu_native_ms']:>14.3f}{r['xla_ms']:>10.3f}{r['rel_err']:>10.1e}")
    mm = matmuls(ns.reps, [int(x) for x in rows.split(",")])
    print(f"\n{'matmuls, 30 layers':<24}{'cpu_native ms':>14}{'xla ms':>10}{'rel err':>10}")
    for r in mm:
        print(f"{str(r['rows']) + ' rows':<24}{r['cpu_native_ms']:>14.1f}{r['xla_ms']:>10.1f}{r['rel_err']:>10.1e}")
    write_json({"benchmark": "cpu_kernels", "jax": jax.__version__, "attention": att,
                "matmuls": mm}, ns.json or DEFAULT_JSON)
    return 0


if __name__ == "__main__":
    sys.exit(main())
