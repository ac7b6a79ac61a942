"""Compile the engine's whole step for TPU v5e / v6e without a TPU (needs libtpu).

    python benchmarks/kernel_bench/tpu_compile_check.py --json out.json [--only 8b-v5e-2x2]
    python benchmarks/kernel_bench/tpu_compile_check.py --kernels --json out.json

``--kernels``: instead, every Mosaic kernel variant
(kernels_pallas/pallas/tpu_compile.py ``full_matrix``) on v5e and v6e, each
under 80% of the VMEM limit the kernel asks for.

For each target (model, slice, tensor parallelism) the engine's runner is
built over the slice's compile-only devices with shape-only weights and KV
pool (pagedjax/worker/aot.py), and libtpu compiles a decode step and a mixed
step (the model with the Mosaic attention kernel), the sampler and the page
copies. Prints the compiler's memory analysis per program and chip, and how
many KV pages the chip's HBM leaves room for. Exit 1 on any compile or
partitioning error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

GIB = 1 << 30
HBM = {"v5e": 16 * GIB, "v6e": 32 * GIB}  # per chip

# An 8B-class Llama (the shapes of Llama 3 8B), weights shape-only.
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
}

# name -> (model, topology, tp, KV pages compiled)
TARGETS = {
    "default-v5e-1x1": ("default", "v5e:1x1", 1, 1024),
    "default-v6e-1x1": ("default", "v6e:1x1", 1, 1024),
    "8b-v5e-1x1": ("8b", "v5e:1x1", 1, 256),
    "8b-v6e-1x1": ("8b", "v6e:1x1", 1, 2048),
    "8b-v5e-2x2": ("8b", "v5e:2x2", 4, 2048),
    "8b-v6e-2x2": ("8b", "v6e:2x2", 4, 2048),
}


def build_model(name: str, num_layers: int | None = None):
    import pagedjax.models as models

    if name == "default":
        resolved = models.resolve_model(None)
        cls, config = models.model_class(resolved.architecture), resolved.hf_config
    else:
        cls, config = models.model_class("LlamaForCausalLM"), dict(LLAMA_8B)
    if num_layers:
        config = dict(config, num_hidden_layers=num_layers)
    from pagedjax.models.runtime import CausalLM
    import jax.numpy as jnp

    return CausalLM(cls, config, jnp.bfloat16)  # the model dtype on a TPU


def run_target(name: str, kinds=("decode", "mixed"), num_layers: int | None = None) -> dict:
    from pagedjax.worker import aot

    model_name, topology, tp, num_pages = TARGETS[name]
    t0 = time.perf_counter()
    model = build_model(model_name, num_layers)
    devices = aot.tpu_devices(topology)
    runner = aot.abstract_runner(model, devices, tp=tp, num_pages=num_pages)
    programs = aot.compile_step(runner, devices[0], kinds=kinds)
    weights = aot.per_chip_bytes(runner.params)
    kv = aot.per_chip_bytes(runner.kv_caches)
    page = aot.kv_bytes_per_page_per_chip(model, runner.page_size, model.dtype, tp)
    hbm = HBM[topology.split(":")[0]]
    worst = max(programs, key=lambda p: p.temporaries + p.code)
    # Temporaries as large as the pool are copies of it (a layout change around the
    # kernel): they grow with the pool, so each page costs that much more.
    scaling = worst.temporaries / kv if worst.temporaries > kv / 2 else 0.0
    fixed = 0 if scaling else worst.temporaries
    free = hbm - weights - fixed - worst.code
    return dict(target=name, model=model_name, topology=topology, tp=tp,
                layers=model.info.num_layers, num_pages=num_pages, hbm_bytes=hbm,
                weights_bytes=weights, kv_pool_bytes=kv, kv_page_bytes=page,
                pages_fit=max(0, int(free // (page * (1 + scaling)))),
                temp_per_pool=scaling, seconds=time.perf_counter() - t0,
                programs=[dataclasses.asdict(p) for p in programs])


def _print(r: dict) -> None:
    mib = lambda b: f"{b / 2**20:9.1f}"  # noqa: E731
    print(f"\n{r['target']}: {r['model']} ({r['layers']} layers) on {r['topology']} TP={r['tp']}, "
          f"compiled in {r['seconds']:.0f} s; per chip: weights {mib(r['weights_bytes'])} MiB, "
          f"KV pool {mib(r['kv_pool_bytes'])} MiB ({r['num_pages']} pages of "
          f"{r['kv_page_bytes'] / 1024:.0f} KiB)")
    print(f"  {'program':<34} {'args MiB':>9} {'out MiB':>9} {'alias MiB':>9} {'temp MiB':>9} "
          f"{'code MiB':>9}")
    for p in r["programs"]:
        print(f"  {p['program']:<34} {mib(p['arguments'])} {mib(p['outputs'])} "
              f"{mib(p['aliased'])} {mib(p['temporaries'])} {mib(p['code'])}")
    print(f"  HBM {r['hbm_bytes'] / GIB:.0f} GiB per chip leaves room for {r['pages_fit']} KV "
          f"pages ({r['pages_fit'] * 16} tokens) beside the weights and the largest step's "
          f"temporaries and code"
          + (f" (temporaries {r['temp_per_pool']:.2f}x the pool: copies of it, counted per page)"
             if r["temp_per_pool"] else ""))


def run_kernels(json_path: str | None) -> int:
    from pagedjax.kernels_pallas.pallas import tpu_compile as tc

    rows = []
    print(f"{'variant':<48} {'chip':<4} {'args MiB':>9} {'code KiB':>9} {'s':>5} status")
    for v in tc.full_matrix():
        for chip in ("v5e", "v6e"):
            t0 = time.perf_counter()
            row = dict(variant=v.label, chip=chip, vmem_limit=tc.HEADROOM_VMEM_LIMIT)
            try:
                m = tc.compile_variant(v, chip).memory_analysis()
                row.update(ok=True, arguments=m.argument_size_in_bytes,
                           code=m.generated_code_size_in_bytes)
            except Exception as e:  # noqa: BLE001 - reported per row
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            if row["ok"]:
                print(f"{v.label:<48} {chip:<4} {row['arguments'] / 2**20:>9.1f} "
                      f"{row['code'] / 1024:>9.0f} {row['seconds']:>5.0f} ok", flush=True)
            else:
                print(f"{v.label:<48} {chip:<4} FAIL {row['error']}", flush=True)
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows)} compiles, {len(failed)} failed")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=tuple(TARGETS))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--kernels", action="store_true", help="the Mosaic kernel variants instead")
    a = ap.parse_args(argv)
    if a.kernels:
        return run_kernels(a.json)
    results, failed = [], []
    for name in a.only or TARGETS:
        try:
            r = run_target(name)
        except Exception as e:  # noqa: BLE001 - reported, then exit 1
            failed.append(name)
            print(f"\n{name}: FAILED {type(e).__name__}: {str(e)[:1500]}", flush=True)
            continue
        _print(r)
        sys.stdout.flush()
        results.append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(results=results, failed=failed), f, indent=1)
    print(f"\n{len(results)} targets compiled, {len(failed)} failed {failed or ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
