"""Ragged paged-attention kernel benchmark.

On a GPU: times the Triton kernel on decode steps over a grid of batch sizes
and context lengths, and on mixed prefill+decode steps; reports achieved HBM
bandwidth (bytes of K/V, scales, q and out that must move, over the median
time) against the chip's peak, and times JAX's own Pallas GPU paged-attention
kernel (``jax.experimental.pallas.ops.gpu.paged_attention``) on the same
decode inputs (layouts converted outside the timed region). Prints a table
and writes JSON (``benchmarks/results/attention_kernels.json`` or ``--json``).

Elsewhere (CPU): a correctness pass of both kernels in interpret mode against
the reference on small shapes; no speed is measured.

    python benchmarks/kernel_bench/attention_kernels.py [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pagedjax.kernels_pallas.pallas import mosaic_tpu  # noqa: E402
from pagedjax.kernels_pallas import reference  # noqa: E402
from pagedjax.kernels_pallas.pallas import triton_gpu  # noqa: E402
from pagedjax.kernels_pallas.kv_write import quantize  # noqa: E402

# Vendor datasheet HBM bandwidth (bytes/s) by device kind substring.
PEAK_BW = {
    "H200": 4.8e12,
    "H100": 3.35e12,
    "H800": 3.35e12,
    "A100": 2.0e12,
    "L4": 0.3e12,
}


def peak_bandwidth(kind: str):
    for k, v in PEAK_BW.items():
        if k in kind:
            return v
    return None


def make_inputs(key, q_lens, kv_lens, *, hq, hkv, d, ps, kv_dtype, q_dtype=jnp.bfloat16,
                spare_pages=0):
    """Random paged inputs, pages scattered (permuted) over the pool."""
    s = len(q_lens)
    need = [-(-k // ps) for k in kv_lens]
    p = max(need)
    n = 1 + sum(need) + spare_pages
    k1, k2, k3 = jax.random.split(key, 3)
    perm = np.asarray(jax.random.permutation(k1, np.arange(1, n)))
    table = np.zeros((s, p), np.int32)
    c = 0
    for i, m in enumerate(need):
        table[i, :m] = perm[c:c + m]
        c += m
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = jax.random.normal(k2, (int(cu[-1]), hq, d), jnp.float32).astype(q_dtype)
    vals = jax.random.normal(k3, (n, 2, hkv, ps, d), jnp.float32)
    scales = None
    if jnp.dtype(kv_dtype) in (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn)):
        pages, scales = quantize(vals, kv_dtype)
    else:
        pages = vals.astype(kv_dtype)
    args = (q, pages, jnp.asarray(kv_lens, jnp.int32), jnp.asarray(table), jnp.asarray(cu),
            jnp.asarray([s], jnp.int32))
    return args, scales


def bytes_moved(args, scales, hkv):
    q, pages, kv_lens, table, cu, _ = args
    d = q.shape[-1]
    tokens = int(np.sum(np.asarray(kv_lens)))
    kv = tokens * 2 * hkv * d * jnp.dtype(pages.dtype).itemsize
    sc = 0 if scales is None else tokens * 2 * hkv * 4
    qo = 2 * q.size * jnp.dtype(q.dtype).itemsize
    return kv + sc + qo


def time_fn(fn, *args, warmup=3, iters=20):
    out = fn(*args)
    jax.block_until_ready(out)
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def rel_err(a, b):
    a = np.asarray(jnp.asarray(a).astype(jnp.float32))
    b = np.asarray(jnp.asarray(b).astype(jnp.float32))
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def gpu_bench(quick: bool):
    dev = jax.devices()[0]
    kind = dev.device_kind
    peak = peak_bandwidth(kind)
    hq, hkv, d, ps = 32, 8, 128, 16
    sm = d ** -0.5
    rows = []
    batches = [1, 8, 32, 128] if not quick else [8, 64]
    ctxs = [512, 2048, 8192] if not quick else [2048]
    kv_dtypes = [("bf16", jnp.bfloat16), ("int8", jnp.int8)] if not quick else [("bf16", jnp.bfloat16)]
    key = jax.random.key(0)
    from jax.experimental.pallas.ops.gpu import paged_attention as jax_pa

    for name, kvd in kv_dtypes:
        for b in batches:
            for ctx in ctxs:
                key, sub = jax.random.split(key)
                args, scales = make_inputs(sub, [1] * b, [ctx] * b, hq=hq, hkv=hkv, d=d, ps=ps,
                                           kv_dtype=kvd)
                nbytes = bytes_moved(args, scales, hkv)
                f = jax.jit(lambda *a, sc=scales: triton_gpu.ragged_paged_attention(
                    *a, sm_scale=sm, kv_scales=sc, max_q_len=1))
                row = dict(kind="decode", kv_dtype=name, batch=b, ctx=ctx, hq=hq, hkv=hkv, d=d,
                           page_size=ps, bytes=nbytes)
                try:
                    t, out = time_fn(f, *args)
                    ref = reference.ragged_paged_attention(*args, sm_scale=sm, kv_scales=scales,
                                                           max_q_len=1)
                    row.update(ms=t * 1e3, gbps=nbytes / t / 1e9, err=rel_err(out, ref))
                    if peak:
                        row["frac_peak"] = nbytes / t / peak
                except Exception as e:  # report, keep going
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                if name == "bf16":
                    q, pages = args[0], args[1]
                    kp = jnp.transpose(pages[:, :, 0::2, :], (2, 0, 1, 3))
                    vp = jnp.transpose(pages[:, :, 1::2, :], (2, 0, 1, 3))
                    p = args[3].shape[1]
                    splits = max(s for s in (16, 8, 4, 2, 1) if p % s == 0)
                    ppcb = max(c for c in (8, 4, 2, 1) if (p // splits) % c == 0)
                    g = jax.jit(lambda q, kp, vp, bt, ln: jax_pa.paged_attention(
                        q * sm, kp, vp, bt, ln, k_splits=splits, pages_per_compute_block=ppcb))
                    try:
                        tj, outj = time_fn(g, q, kp, vp, args[3], args[2])
                        row.update(jax_ms=tj * 1e3, jax_err=rel_err(outj, ref) if "err" in row else None)
                        if "ms" in row:
                            row["speedup_vs_jax"] = tj / t
                    except Exception as e:
                        row["jax_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                del args
    # Mixed steps: prefill chunks and decode rows in one call.
    for chunks, n_dec, ctx in ([(2, 64, 2048), (4, 16, 8192)] if not quick else [(2, 32, 2048)]):
        key, sub = jax.random.split(key)
        q_lens = [512] * chunks + [1] * n_dec
        kv_lens = [ctx] * (chunks + n_dec)
        args, scales = make_inputs(sub, q_lens, kv_lens, hq=hq, hkv=hkv, d=d, ps=ps,
                                   kv_dtype=jnp.bfloat16)
        nbytes = bytes_moved(args, scales, hkv)
        flops = sum(4 * ql * kl * hq * d for ql, kl in zip(q_lens, kv_lens))  # upper bound
        f = jax.jit(lambda *a: triton_gpu.ragged_paged_attention(*a, sm_scale=sm, max_q_len=512))
        row = dict(kind="mixed", kv_dtype="bf16", batch=chunks + n_dec, prefill_chunks=chunks,
                   chunk=512, ctx=ctx, hq=hq, hkv=hkv, d=d, page_size=ps, bytes=nbytes,
                   flops=flops)
        try:
            t, out = time_fn(f, *args)
            ref = reference.ragged_paged_attention(*args, sm_scale=sm, max_q_len=512)
            row.update(ms=t * 1e3, gbps=nbytes / t / 1e9, tflops=flops / t / 1e12,
                       err=rel_err(out, ref))
            if peak:
                row["frac_peak"] = nbytes / t / peak
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
    return dict(device=kind, peak_bw=peak, jax=jax.__version__, rows=rows)


def print_table(res):
    print(f"device: {res['device']}  peak HBM: {res['peak_bw'] and res['peak_bw'] / 1e12} TB/s  "
          f"jax {res['jax']}")
    hdr = f"{'kind':6} {'kv':5} {'batch':>5} {'ctx':>6} {'ms':>8} {'GB/s':>7} {'%peak':>6} " \
          f"{'err':>8} {'jax ms':>8} {'x jax':>6}"
    print(hdr)
    for r in res["rows"]:
        if "error" in r:
            print(f"{r['kind']:6} {r['kv_dtype']:5} {r['batch']:>5} {r['ctx']:>6} ERROR {r['error']}")
            continue
        jms = f"{r['jax_ms']:8.3f}" if "jax_ms" in r else f"{'-':>8}"
        sp = f"{r['speedup_vs_jax']:6.2f}" if "speedup_vs_jax" in r else f"{'-':>6}"
        fp = f"{100 * r['frac_peak']:6.1f}" if "frac_peak" in r else f"{'-':>6}"
        print(f"{r['kind']:6} {r['kv_dtype']:5} {r['batch']:>5} {r['ctx']:>6} {r['ms']:8.3f} "
              f"{r['gbps']:7.0f} {fp} {r['err']:8.1e} {jms} {sp}")
        if "jax_error" in r:
            print(f"        jax kernel: {r['jax_error']}")


def cpu_check():
    """Interpret-mode correctness of both kernels on small shapes; no timing."""
    rows = []
    key = jax.random.key(1)
    cases = [("decode", [1, 1, 1], [5, 17, 33]), ("mixed", [4, 1, 3, 1], [9, 20, 3, 1])]
    for name, q_lens, kv_lens in cases:
        for kvd, qd, tol in [(jnp.float32, jnp.float32, 2e-5), (jnp.int8, jnp.bfloat16, 2e-2)]:
            key, sub = jax.random.split(key)
            args, scales = make_inputs(sub, q_lens, kv_lens, hq=4, hkv=2, d=16, ps=4,
                                       kv_dtype=kvd, q_dtype=qd, spare_pages=2)
            mq = 1 if name == "decode" else None
            ref = reference.ragged_paged_attention(*args, sm_scale=0.25, kv_scales=scales,
                                                   max_q_len=mq)
            for kname, mod in (("triton_gpu", triton_gpu), ("mosaic_tpu", mosaic_tpu)):
                out = mod.ragged_paged_attention(*args, sm_scale=0.25, kv_scales=scales,
                                                 max_q_len=mq, interpret=True)
                err = rel_err(out, ref)
                rows.append(dict(kind=name, kernel=kname, kv_dtype=jnp.dtype(kvd).name,
                                 err=err, ok=err < tol))
                print(f"{name:6} {kname:10} {jnp.dtype(kvd).name:8} rel err {err:.2e} "
                      f"{'ok' if err < tol else 'FAIL'}")
    print("no speed was measured: no GPU here (interpret mode is a correctness check only)")
    return dict(device=jax.devices()[0].device_kind, jax=jax.__version__, cpu_check=rows,
                speed_measured=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results",
                                                   "attention_kernels.json"))
    ap.add_argument("--quick", action="store_true", help="a smaller GPU grid")
    a = ap.parse_args()
    if jax.default_backend() == "gpu":
        res = gpu_bench(a.quick)
        print_table(res)
        res["speed_measured"] = True
    else:
        res = cpu_check()
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1, default=float)
    print(f"wrote {a.json}")
    if not res.get("speed_measured") and not all(r["ok"] for r in res["cpu_check"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
