"""Expected times from the roofline, printed beside measured ones when given.

    python benchmarks/kernel_bench/roofline.py [--measured attention_kernels.json] [--json out.json]

1. Per attention variant (kernels_pallas/pallas/gpu_variants.py, representative
   set): bytes and FLOPs of one launch on a stated batch, and its time at
   H100 / H200 / A100 and TPU v5e / v6e peak bandwidth and compute.
2. Per model: a decode step (weights, attention, KV writes) of the default
   model and an 8B-class Llama at batch 1 and 64, 2048 tokens of context.
3. With ``--measured`` (the JSON of benchmarks/attention_kernels.py from a
   GPU): each measured row beside its roofline time on that device.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from pagedjax.kernels_pallas.pallas import roofline as rl  # noqa: E402

CHIPS = ("H100", "H200", "A100", "v5e", "v6e")
CTX = 2048
ITEMSIZE = {"bfloat16": 2, "bf16": 2, "int8": 1, "float8_e4m3fn": 1, "fp8": 1}


def variant_workload(v):
    """(q_lens, kv_lens): a decode batch of 64 rows or a mixed step of two
    512-token prefill chunks and 64 decode rows, all at 2048 tokens of context."""
    if v.kind == "decode":
        return [1] * 64, [CTX] * 64
    return [512] * 2 + [1] * 64, [CTX] * 66


def variant_rows():
    from pagedjax.kernels_pallas.pallas import gpu_variants as gv

    rows = []
    for v in gv.representative():
        q_lens, kv_lens = variant_workload(v)
        hkv = 8
        cost = rl.attention(q_lens, kv_lens, hq=hkv * v.group, hkv=hkv, d=v.head_dim,
                            kv_itemsize=ITEMSIZE[v.page_dtype],
                            quantized=v.page_dtype != "bfloat16",
                            window=4096 if v.window else None)
        rows.append(dict(variant=v.label, hq=hkv * v.group, hkv=hkv, bytes=cost.bytes,
                         flops=cost.flops,
                         **{f"{c}_us": cost.seconds(rl.CHIPS[c]) * 1e6 for c in CHIPS}))
    return rows


def model_rows():
    rows = []
    for m in (rl.SMOLLM2_135M, rl.LLAMA_8B):
        for batch in (1, 64):
            cost = rl.decode_step(m, batch, CTX)
            row = dict(model=m.name, batch=batch, ctx=CTX, bytes=cost.bytes, flops=cost.flops,
                       **{f"{c}_ms": cost.seconds(rl.CHIPS[c]) * 1e3 for c in CHIPS})
            row["v5e_tp4_ms"] = cost.seconds(rl.CHIPS["v5e"], tp=4) * 1e3
            rows.append(row)
    return rows


def chip_of(device_kind: str):
    for key in ("H200", "H100", "A100"):
        if key in device_kind:
            return rl.CHIPS[key]
    if "v5" in device_kind and "lite" in device_kind:
        return rl.CHIPS["v5e"]
    if "v6" in device_kind:
        return rl.CHIPS["v6e"]
    return None


def measured_rows(path: str):
    with open(path) as f:
        res = json.load(f)
    chip = chip_of(res.get("device", ""))
    out = []
    for r in res.get("rows", []):
        if "ms" not in r:
            continue
        b = r["batch"]
        q_lens = [1] * b if r["kind"] == "decode" else (
            [r["chunk"]] * r["prefill_chunks"] + [1] * (b - r["prefill_chunks"]))
        cost = rl.attention(q_lens, [r["ctx"]] * b, hq=r["hq"], hkv=r["hkv"], d=r["d"],
                            kv_itemsize=ITEMSIZE[r["kv_dtype"]], quantized=r["kv_dtype"] != "bf16")
        exp = cost.seconds(chip) * 1e3 if chip else None
        out.append(dict(kind=r["kind"], kv_dtype=r["kv_dtype"], batch=b, ctx=r["ctx"],
                        measured_ms=r["ms"], expected_ms=exp,
                        of_roofline=exp / r["ms"] if exp else None))
    return res.get("device", "?"), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", help="attention_kernels.py JSON from a GPU run")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    res = dict(variants=variant_rows(), models=model_rows())
    print(f"Attention launch at the roofline, context {CTX} (decode: 64 rows; mixed: "
          f"2 x 512-token chunks + 64 rows; Hkv 8), microseconds:")
    print(f"{'variant':<46} {'MB':>8} {'GFLOP':>8} " + " ".join(f"{c:>7}" for c in CHIPS))
    for r in res["variants"]:
        print(f"{r['variant']:<46} {r['bytes'] / 1e6:>8.1f} {r['flops'] / 1e9:>8.1f} "
              + " ".join(f"{r[c + '_us']:>7.1f}" for c in CHIPS))
    print(f"\nDecode step at the roofline (weights bf16 once, attention, KV writes), ms:")
    print(f"{'model':<20} {'batch':>5} {'GB':>7} " + " ".join(f"{c:>7}" for c in CHIPS)
          + "  v5e TP=4")
    for r in res["models"]:
        print(f"{r['model']:<20} {r['batch']:>5} {r['bytes'] / 1e9:>7.3f} "
              + " ".join(f"{r[c + '_ms']:>7.3f}" for c in CHIPS) + f"  {r['v5e_tp4_ms']:>7.3f}")
    if a.measured:
        dev, rows = measured_rows(a.measured)
        res["measured"] = dict(device=dev, rows=rows)
        print(f"\nMeasured on {dev} beside the roofline (benchmarks/attention_kernels.py):")
        print(f"{'kind':<7} {'kv':<5} {'batch':>5} {'ctx':>6} {'measured ms':>12} "
              f"{'expected ms':>12} {'of roofline':>11}")
        for r in rows:
            exp = f"{r['expected_ms']:>12.4f}" if r["expected_ms"] else f"{'?':>12}"
            frac = f"{r['of_roofline']:>11.0%}" if r["of_roofline"] else f"{'?':>11}"
            print(f"{r['kind']:<7} {r['kv_dtype']:<5} {r['batch']:>5} {r['ctx']:>6} "
                  f"{r['measured_ms']:>12.4f} {exp} {frac}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
