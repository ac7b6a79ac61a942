"""The Qwen2.5-VL vision tower at large patch buckets: milliseconds per image with the
window layers reading only the keys their windows reach (the engine's path) against
dense masked attention over every patch (the same program with one query block).

    python benchmarks/features/qwen_vl_encoder.py
    python benchmarks/features/qwen_vl_encoder.py --grids 32x32,32x64,64x64 --reps 3

The tower is random, built here (no weights downloaded): 8 blocks 256 wide, 4 heads,
full attention in blocks 3 and 7, 14-pixel patches, 112-pixel windows (64 patches),
the merger into a 64-wide text model. Both variants are checked to give the same
rows before timing. Prints a table and writes JSON (default
benchmarks/results/qwen_vl_encoder.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __package__ in (None, ""):
    sys.path.insert(0, ROOT)

from pagedjax.benchmarks import machine  # noqa: E402

DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "qwen_vl_encoder.json")
VISION = dict(hidden_size=256, intermediate_size=512, num_heads=4, depth=8, in_channels=3,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
              fullatt_block_indexes=[3, 7], out_hidden_size=64, hidden_act="silu")


def build_tower():
    """(module, params) of a random tower (the text model is not needed)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from pagedjax.models.qwen2_5_vl_vision import Qwen2_5_VisionTower

    tower = nnx.eval_shape(lambda: Qwen2_5_VisionTower(VISION))
    graph, state = nnx.split(tower)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    values = [0.05 * jax.random.normal(k, v.shape, jnp.float32) for k, v in zip(keys, leaves)]
    return graph, jax.tree.unflatten(tree, values)


def time_variant(graph, params, inputs, query_block: int, reps: int):
    import jax
    from flax import nnx

    from pagedjax.models import qwen2_5_vl_vision as V

    old, V.QUERY_BLOCK = V.QUERY_BLOCK, query_block
    try:
        fn = jax.jit(lambda p, x: nnx.merge(graph, p)(x))
        out = jax.block_until_ready(fn(params, inputs))  # compile
        t0 = time.perf_counter()
        for _ in range(reps):
            jax.block_until_ready(fn(params, inputs))
        return (time.perf_counter() - t0) / reps * 1e3, out
    finally:
        V.QUERY_BLOCK = old


def main(argv=None) -> dict:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grids", default="32x32,32x64,64x64", help="patch grids HxW")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=DEFAULT_JSON)
    ns = ap.parse_args(argv)
    graph, params = build_tower()
    tower = __import__("flax").nnx.merge(graph, params)
    rows = []
    for g in ns.grids.split(","):
        gh, gw = (int(v) for v in g.split("x"))
        px = np.random.default_rng(0).standard_normal((gh * gw, 3 * 2 * 14 * 14), np.float32)
        inputs = tower.encoder_inputs(px, (1, gh, gw))
        n = len(inputs["patches"])
        banded, a = time_variant(graph, params, inputs, 1024, ns.reps)
        dense, b = time_variant(graph, params, inputs, 1 << 30, ns.reps)
        err = float(np.abs(np.asarray(a) - np.asarray(b)).max())
        rows.append({"grid": g, "patches": gh * gw, "bucket": n, "banded_ms": banded,
                     "dense_ms": dense, "ratio": dense / banded, "max_abs_diff": err})
        print(f"{g:>7} patches {gh * gw:5d} bucket {n:5d}  banded {banded:8.1f} ms  "
              f"dense {dense:8.1f} ms  dense/banded {dense / banded:5.2f}  diff {err:.1e}",
              flush=True)
    result = {"rows": rows, "vision": VISION, "machine": machine.machine(), "loadavg": machine.loadavg()}
    os.makedirs(os.path.dirname(ns.json), exist_ok=True)
    with open(ns.json, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
