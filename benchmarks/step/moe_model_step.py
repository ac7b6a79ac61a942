"""A mixture-of-experts model's decode step against its matmul floor: the same model
with every MoE block replaced by the dense chain of its top-k experts.

    python benchmarks/step/moe_model_step.py [--layers 4 --hidden 512 --inter 256
                                              --experts 32 --top-k 4] [--rows 1 16 64]
                                             [--context 256] [--json out.json]

Two pagedjax models built from configs with random weights (std 0.02), float32:

  moe     Qwen3MoeForCausalLM: attention (16 query / 4 KV heads, head dim 32), every
          layer a SparseMoE MLP of E experts of width I, top-k, renormalised
  floor   Qwen3ForCausalLM with the same attention, norms, embeddings and LM head and
          one dense gated MLP of width k * I per layer: the active parameters of the
          MoE model as one same-shape matmul chain, no router and no grouping

For each row count R it times the model part of a decode step as the runner runs it
(``model.forward`` + logits of the R rows, KV pool donated), R sequences of
``--context`` tokens each on their own pages, the engine's execution plan for the
CPU (``worker.plan.make_plan``: the C++ attention and few-row matmuls where this
machine measured them faster). Each variant is called ``--repeat`` times round-robin
with the other and its fastest call reported. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
PAGE = 16


def configs(ns) -> tuple[dict, dict]:
    common = dict(vocab_size=ns.vocab, hidden_size=ns.hidden, num_hidden_layers=ns.layers,
                  num_attention_heads=16, num_key_value_heads=4, head_dim=32,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  rope_theta=1e6)
    moe = dict(common, architectures=["Qwen3MoeForCausalLM"], num_experts=ns.experts,
               num_experts_per_tok=ns.top_k, moe_intermediate_size=ns.inter,
               intermediate_size=ns.inter, norm_topk_prob=True)
    dense = dict(common, architectures=["Qwen3ForCausalLM"],
                 intermediate_size=ns.top_k * ns.inter)
    return moe, dense


def build(config: dict, seed: int):
    """(CausalLM, random params) of a config."""
    from flax import nnx

    from pagedjax.models import model_class
    from pagedjax.models.runtime import CausalLM

    cls = model_class(config["architectures"][0])
    model = CausalLM(cls, config)
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda a: jnp.asarray(0.02 * rng.standard_normal(a.shape), a.dtype),
        nnx.state(model.abstract, nnx.Param))
    return model, params


def batch(rows: int, context: int):
    from pagedjax.models.metadata import SeqChunk, build_metadata

    per = -(-context // PAGE)
    chunks = [SeqChunk(list(range(1 + r * per, 1 + (r + 1) * per)), context - 1, 1)
              for r in range(rows)]
    meta = build_metadata(chunks, PAGE, max_q_len=1)
    tokens = jnp.asarray(np.random.default_rng(rows).integers(0, 1000, rows), jnp.int32)
    return tokens, meta, 1 + rows * per


def step_fn(model, plan):
    def f(params, kv, tokens, meta):
        hidden, kv = model.forward(params, kv, tokens, meta, plan)
        return model.compute_logits(params, hidden, plan), kv
    return jax.jit(f, donate_argnums=(1,))


def run(ns) -> list[dict]:
    from pagedjax.kernels_pallas import resolve_backend
    from pagedjax.worker.plan import make_plan

    plan = make_plan(resolve_backend("auto"))
    built = {name: build(cfg, seed) for (name, cfg), seed in zip(
        zip(("moe", "floor"), configs(ns)), (0, 1))}
    out = []
    for rows in ns.rows:
        tokens, meta, pages = batch(rows, ns.context)
        state = {}
        for name, (model, params) in built.items():
            kv = model.allocate_kv_caches(pages, PAGE)
            fn = step_fn(model, plan)
            _, kv = fn(params, kv, tokens, meta)  # compile
            jax.block_until_ready(kv)
            state[name] = [fn, params, kv, []]
        for _ in range(ns.repeat):
            for name, s in state.items():
                fn, params, kv, times = s
                t0 = time.perf_counter()
                logits, kv = fn(params, kv, tokens, meta)
                jax.block_until_ready(logits)
                times.append(time.perf_counter() - t0)
                s[2] = kv
        row = {"rows": rows, **{f"{n}_ms": min(s[3]) * 1e3 for n, s in state.items()}}
        row["moe_over_floor"] = row["moe_ms"] / row["floor_ms"]
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--inter", type=int, default=256)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    from pagedjax.benchmarks import machine

    rows = run(ns)
    print(f"\nMoE model decode step: {ns.layers} layers, H={ns.hidden}, E={ns.experts} x "
          f"I={ns.inter}, top-{ns.top_k}; floor: dense MLP of width {ns.top_k * ns.inter}; "
          f"context {ns.context}; {jax.default_backend()} float32, fastest of {ns.repeat}")
    print("| rows | moe step ms | floor step ms | moe / floor |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['rows']} | {r['moe_ms']:.2f} | {r['floor_ms']:.2f} | "
              f"**{r['moe_over_floor']:.2f}x** |")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"config": vars(ns), "rows": rows, "machine": machine.machine(),
                       "date": time.strftime("%Y-%m-%d")}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
