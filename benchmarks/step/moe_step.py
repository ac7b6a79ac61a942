"""Mixture-of-experts MLP of a decode step against the matmul floor of its active
parameters, and the grouped matmul against a dense all-experts einsum.

    python benchmarks/step/moe_step.py [--hidden 1024 --inter 384 --experts 64 --top-k 8]
                                  [--rows 1 16 64] [--json out.json]

For each row count R (tokens of a step), times one jitted call of:

  moe/<impl>   pagedjax.models.moe.SparseMoE (router, top-k, tokens grouped by expert,
               grouped matmul ``impl``: auto, gather, blocked, ragged)
  dense-all    the same layer computing every expert for every token (two plain matmuls
               over all experts' weights, pre-laid out) and weighting the top-k: what
               grouping avoids
  floor        the matmul floor of the active parameters: one dense gated MLP of
               width top_k * inter (the same-shape chain of k experts, no routing)

Random weights (std 0.02) and tokens; float32 on CPU. Each variant is called
``--repeat`` times, round-robin with the others, and its fastest call is reported (on a
shared machine the minimum is the least disturbed figure); prints a table of ms and
ratios, and writes JSON. Quote the ratios.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np


def _time_all(calls: dict, repeat: int) -> dict:
    """name -> (fn, args): the minimum ms of ``repeat`` calls each, taken round-robin so
    that load from other processes falls on every variant alike."""
    for fn, args in calls.values():
        jax.block_until_ready(fn(*args))  # compile
    times = {name: [] for name in calls}
    for _ in range(repeat):
        for name, (fn, args) in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - t0)
    return {name: min(t) * 1e3 for name, t in times.items()}


def build(h: int, inter: int, e: int, k: int, seed: int = 0):
    from flax import nnx

    from pagedjax.models.moe import SparseMoE

    rng = np.random.default_rng(seed)
    moe = SparseMoE(h, inter, e, k, "silu", renormalize=True)
    state = nnx.state(moe)
    flat = {p: jnp.asarray(0.02 * rng.standard_normal(v.shape), jnp.float32)
            for p, v in nnx.to_flat_state(state)}
    nnx.update(moe, nnx.traversals.unflatten_mapping(flat))
    floor_gu = jnp.asarray(0.02 * rng.standard_normal((h, 2, k * inter)), jnp.float32)
    floor_d = jnp.asarray(0.02 * rng.standard_normal((k * inter, h)), jnp.float32)
    return moe, floor_gu, floor_d


def run(args) -> list[dict]:
    from flax import nnx

    from pagedjax.models import moe as M
    from pagedjax.models.base import ExecutionPlan

    moe, floor_gu, floor_d = build(args.hidden, args.inter, args.experts, args.top_k)
    graph, state = nnx.split(moe)

    def moe_call(impl):
        plan = ExecutionPlan(moe_impl=impl)
        return jax.jit(lambda st, x: nnx.merge(graph, st)(x, plan))

    # The dense formulation's weights in plain-matmul layout (made once, not timed):
    # gate/up [H, E*2*I], down [E*I, H].
    e, h, inter = args.experts, args.hidden, args.inter
    dense_gu = jnp.asarray(np.asarray(moe.experts_gate_up[...]).transpose(1, 0, 2, 3)
                           .reshape(h, e * 2 * inter))
    dense_d = moe.experts_down[...].reshape(e * inter, h)

    def dense_all(st, gu_w, d_w, x):
        m = nnx.merge(graph, st)
        w, ids = M.route(x @ m.gate.kernel[...], m.top_k, m.renormalize)
        sel = jnp.sum(jax.nn.one_hot(ids, e) * w[..., None], axis=1)  # [T, E]
        gu = (x @ gu_w).reshape(-1, e, 2, inter)  # every expert, every token
        act = jax.nn.silu(gu[:, :, 0]) * gu[:, :, 1] * sel[:, :, None]
        return act.reshape(-1, e * inter) @ d_w

    def floor(gu_w, d_w, x):
        gu = jnp.einsum("th,hci->tci", x, gu_w)
        return (jax.nn.silu(gu[:, 0]) * gu[:, 1]) @ d_w

    rows_out = []
    rng = np.random.default_rng(1)
    for r in args.rows:
        x = jnp.asarray(rng.standard_normal((r, args.hidden)), jnp.float32)
        calls = {"floor": (jax.jit(floor), (floor_gu, floor_d, x))}
        for impl in args.impls:
            calls[f"moe/{impl}"] = (moe_call(impl), (state, x))
        calls["dense-all"] = (jax.jit(dense_all), (state, dense_gu, dense_d, x))
        row = {"rows": r, **_time_all(calls, args.repeat)}
        ref = np.asarray(jax.jit(dense_all)(state, dense_gu, dense_d, x))
        got = np.asarray(moe_call("auto")(state, x))
        row["max_abs_diff_auto_vs_dense"] = float(np.abs(ref - got).max())
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    return rows_out


def table(rows: list[dict], impls: list[str]) -> str:
    cols = ["floor", *[f"moe/{i}" for i in impls], "dense-all"]
    out = ["| rows | " + " | ".join(f"{c} ms" for c in cols) + " | moe/auto / floor | "
           "dense-all / moe/auto |", "|" + "---|" * (len(cols) + 3)]
    for row in rows:
        cells = [f"{row[c]:.2f}" for c in cols]
        out.append(f"| {row['rows']} | " + " | ".join(cells)
                   + f" | {row['moe/auto'] / row['floor']:.2f}x"
                   + f" | {row['dense-all'] / row['moe/auto']:.2f}x |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inter", type=int, default=384)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--impls", nargs="+", default=["auto", "gather", "blocked", "ragged"])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if "auto" not in args.impls:
        args.impls = ["auto", *args.impls]
    rows = run(args)
    print(f"\nMoE MLP, H={args.hidden} I={args.inter} E={args.experts} top-{args.top_k}, "
          f"{jax.default_backend()} float32, fastest of {args.repeat} round-robin calls")
    print(table(rows, args.impls))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
