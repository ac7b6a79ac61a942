"""Times the Mosaic ragged paged-attention kernel on a TPU (decode and mixed steps).

    python benchmarks/kernel_bench/tpu_attention.py --json out.json [--quick]

Rows have the fields of benchmarks/attention_kernels.py (kind, kv_dtype,
batch, ctx, hq, hkv, d, page_size, ms), so benchmarks/kernel_bench/roofline.py
``--measured`` prints them beside the roofline. Needs a TPU: elsewhere it
says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pagedjax.kernels_pallas.pallas import mosaic_tpu  # noqa: E402

HQ, HKV, D, PS = 32, 8, 128, 16


def inputs(q_lens, kv_lens, kv_dtype, seed=0):
    """Random pool, pages of each sequence scattered over it."""
    rng = np.random.default_rng(seed)
    need = [-(-k // PS) for k in kv_lens]
    n = 1 + sum(need)
    perm = rng.permutation(np.arange(1, n))
    table = np.zeros((len(q_lens), max(need)), np.int32)
    at = 0
    for i, k in enumerate(need):
        table[i, :k] = perm[at:at + k]
        at += k
    t = sum(q_lens)
    q = jnp.asarray(rng.standard_normal((t, HQ, D)), jnp.bfloat16)
    pages = jnp.asarray(rng.standard_normal((n, 2, HKV, PS, D)) * 4, jnp.float32)
    scales = None
    if kv_dtype == "int8":
        pages, scales = pages.astype(jnp.int8), jnp.full((n, 2, HKV, PS), 0.25, jnp.float32)
    else:
        pages = pages.astype(jnp.bfloat16)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    args = (q, pages, jnp.asarray(kv_lens, jnp.int32), jnp.asarray(table), jnp.asarray(cu),
            jnp.asarray([len(q_lens)], jnp.int32))
    return args, scales


def median_ms(fn, *args, iters=20):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="tpu_attention.json")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    if jax.default_backend() != "tpu":
        print(f"no TPU here (platform {jax.default_backend()}): nothing measured")
        return 2
    rows = []
    cases = [("decode", [1] * b, [c] * b, 0) for b in ((8, 64) if a.quick else (1, 8, 64, 128))
             for c in ((2048,) if a.quick else (512, 2048, 8192))]
    cases.append(("mixed", [512] * 2 + [1] * 64, [2048] * 66, 2))
    for kind, q_lens, kv_lens, chunks in cases:
        for kv_dtype in ("bf16", "int8"):
            args, scales = inputs(q_lens, kv_lens, kv_dtype)
            fn = jax.jit(lambda *x, sc=scales, m=max(q_lens): mosaic_tpu.ragged_paged_attention(
                *x, sm_scale=D ** -0.5, kv_scales=sc, max_q_len=m))
            row = dict(kind=kind, kv_dtype=kv_dtype, batch=len(q_lens), ctx=kv_lens[0], hq=HQ,
                       hkv=HKV, d=D, page_size=PS, chunk=512, prefill_chunks=chunks)
            try:
                row["ms"] = median_ms(fn, *args)
            except Exception as e:  # noqa: BLE001 - reported per row
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(row, flush=True)
            rows.append(row)
    with open(a.json, "w") as f:
        json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, rows=rows), f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
