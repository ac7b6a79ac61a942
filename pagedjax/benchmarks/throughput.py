"""Offline throughput: the same requests through pagedjax and two transformers baselines,
each system in its own fresh process.

    pagedjax bench throughput                       # 64 ShareGPT-shaped requests
    pagedjax bench throughput --workload long --repeat 2
    pagedjax bench throughput --num-requests 16 --skip-hf
    pagedjax bench throughput -- --num-requests 16

Systems, all on identical prompt token ids and identical output lengths
(``--workload``: see pagedjax/benchmarks/workload.py; ``--num-requests``,
``--input-mean`` and ``--output-mean`` override the preset):

* **pagedjax** (pagedjax/benchmarks/run_pagedjax.py): ``LLMEngine`` after a warm-up that
  compiles every step shape the workload can reach; compilations during the
  timed run are counted (must be 0); KV waste, peak pages, a per-bucket step
  profile and a sharing experiment (8 prompts x ``n=4`` vs 32 independent);
  ``--quantization int8|gguf`` keeps pagedjax's weights quantized on the device
  (the weight memory and the mode go into the JSON);
* **HF static** and **HF continuous** (``benchmarks/throughput/hf_baselines.py``
  in the repository): transformers ``generate`` on static batches of 16, and
  transformers' own continuous batching. The installed package holds no torch
  code: the baselines run from a checkout (found beside the package or under
  the working directory) or from ``--hf-baselines PATH``; without the script
  pagedjax runs alone and says how to add them.

Fairness: each system runs in a fresh ``python`` process of its own (a
baseline that shares a process, thread pools or caches with another system is
handicapped: transformers ``generate`` run after pagedjax in one process
measured 2.1-2.5x slower than alone). With ``--repeat N`` the systems run N
rounds, the order reversed every other round; speedups are taken within a
round and their median is reported. The machine (CPU model and flags, cores,
versions) and ``/proc/loadavg`` before and after each run go into the JSON.

Reported: output tokens/s, requests/s, ratios vs each baseline, mean TTFT and
TPOT (all requests arrive at t=0), greedy agreement with transformers.
Prints a table and writes JSON (default benchmarks/results/throughput.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from pagedjax.benchmarks import machine  # noqa: E402
from pagedjax.config import KV_CACHE_DTYPE_CHOICES  # noqa: E402
from pagedjax.benchmarks.workload import (  # noqa: E402
    HF_STATIC_BATCH,
    SHAREGPT_MEAN_IN,
    SHAREGPT_MEAN_OUT,
    WORKLOADS,
    agreement,
    make_workload,
)

# In a checkout the results go beside the other benchmarks' (benchmarks/results/), elsewhere
# into the working directory.
DEFAULT_JSON = (os.path.join("benchmarks", "results", "throughput.json")
                if os.path.isdir("benchmarks") else "pagedjax_throughput.json")
SYSTEMS = ("pagedjax", "hf_static", "hf_continuous")
HF_SCRIPT = os.path.join("benchmarks", "throughput", "hf_baselines.py")
NO_HF_SCRIPT = ("the transformers baselines are a script of the pagedjax repository ({script}), "
                "not part of the installed package: run this command from a checkout of the "
                "repository, or pass --hf-baselines PATH/TO/hf_baselines.py (--skip-hf: "
                "pagedjax alone, without this note). Running pagedjax alone.")


def find_hf_baselines(explicit: str | None = None, cwd: str | None = None) -> str | None:
    """The transformers baselines' script: ``explicit``, else the checkout's beside the
    package (an editable install) or under ``cwd``; None when there is none."""
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    import pagedjax

    roots = (os.path.dirname(os.path.dirname(os.path.abspath(pagedjax.__file__))),
             cwd or os.getcwd())
    for root in roots:
        path = os.path.join(root, HF_SCRIPT)
        if os.path.isfile(path):
            return path
    return None


# ---------------------------------------------------------------------- workers
def batched_tokens(max_num_seqs: int, explicit: int | None = None) -> int:
    """The step token budget pagedjax uses (the engine's default rule); HF continuous gets it too."""
    return explicit or max(512, min(2048, max_num_seqs))


def worker(ns) -> int:
    """Child process: write the workload, or run one system on it; results to --worker-out."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if ns.worker == "workload":
        from pagedjax.models import resolve_model

        vocab = int(resolve_model(ns.model).hf_config.get("vocab_size") or 32000)
        reqs = make_workload(ns.num_requests, ns.input_mean, ns.output_mean, vocab, ns.seed)
        out = {"vocab": vocab, "reqs": reqs}
    else:
        with open(ns.worker_in) as f:
            wl = json.load(f)
        reqs = [(list(p), int(o)) for p, o in wl["reqs"]]
        out = run_system(ns.worker, reqs, wl["vocab"], ns)
    out["pid"] = os.getpid()
    with open(ns.worker_out, "w") as f:
        json.dump(out, f)
    return 0


def run_system(name: str, reqs, vocab: int, ns) -> dict:
    """pagedjax on the workload (in this process). -> result dict with "_tokens"."""
    import jax

    from pagedjax.benchmarks.run_pagedjax import run_pagedjax, sharing_experiment

    res, llm = run_pagedjax(reqs, ns)
    res["jax_backend"] = jax.default_backend()
    if not ns.skip_sharing:
        try:
            res["sharing"] = sharing_experiment(llm, vocab, ns)
        except Exception as e:  # noqa: BLE001 - reported, the rest still runs
            res["sharing"] = {"error": f"{type(e).__name__}: {e}"}
    return res


def hf_command(ns, system: str, workload: str, out: str) -> list[str]:
    """The baseline script's command line for one transformers system (``ns``: this
    CLI's hf_baselines, hf_batch_size, max_num_seqs, max_num_batched_tokens, model and
    no_hf_cache), on the workload file ``workload``, its result to ``out``."""
    cmd = [sys.executable, ns.hf_baselines, "--system", system,
           "--worker-in", workload, "--worker-out", out,
           "--hf-batch-size", str(ns.hf_batch_size), "--max-num-seqs", str(ns.max_num_seqs),
           "--max-num-batched-tokens", str(batched_tokens(ns.max_num_seqs, ns.max_num_batched_tokens))]
    if ns.model:
        cmd += ["--model", ns.model]
    return cmd + (["--no-hf-cache"] if ns.no_hf_cache else [])


def _spawn(ns, argv, system: str, tmp: str, tag: str) -> dict:
    """Run one worker in a fresh interpreter; -> its JSON result."""
    out = os.path.join(tmp, f"{tag}.json")
    if system.startswith("hf_"):
        cmd = hf_command(ns, system, os.path.join(tmp, "workload.json"), out)
    else:
        cmd = [sys.executable, "-m", "pagedjax.benchmarks.throughput", *argv, "--worker",
               system, "--worker-in", os.path.join(tmp, "workload.json"), "--worker-out", out]
    return run_worker(cmd, out, system)


def run_worker(cmd: list[str], out: str, system: str) -> dict:
    """Run one worker command in a fresh interpreter; -> the JSON it wrote to ``out``
    with its process facts (pid, load average before and after, wall time), or
    ``{"system", "error"}`` when it failed."""
    load0, t0 = machine.loadavg(), time.time()
    r = subprocess.run(cmd, env=dict(os.environ))
    if r.returncode != 0 or not os.path.exists(out):
        return {"system": system, "error": f"worker process exited with {r.returncode}"}
    with open(out) as f:
        res = json.load(f)
    res["process"] = {"pid": res.pop("pid", None), "loadavg_before": load0, "loadavg_after": machine.loadavg(),
                      "wall_s": time.time() - t0}
    return res


# ---------------------------------------------------------------------- orchestration
def _order(systems: list[str], rnd: int) -> list[str]:
    return list(systems) if rnd % 2 == 0 else list(reversed(systems))


def _ok(r) -> bool:
    return r is not None and "error" not in r


def combine(rounds: list[dict], systems: list[str]) -> dict:
    """Per system: the median run (by tok/s) with every run's tok/s; speedups per round."""
    out = {}
    for name in systems:
        runs = [rd[name] for rd in rounds if name in rd]
        good = [r for r in runs if _ok(r)]
        if not good:
            out[name] = runs[0] if runs else {"system": name, "error": "not run"}
            continue
        tps = [r["output_tokens_per_s"] for r in good]
        med = good[int(np.argsort(tps)[len(tps) // 2])]
        out[name] = dict(med, runs_output_tokens_per_s=tps)
    pj = out.get("pagedjax")
    for name in systems:
        if name == "pagedjax" or not _ok(out.get(name)) or not _ok(pj):
            continue
        per = [rd["pagedjax"]["output_tokens_per_s"] / rd[name]["output_tokens_per_s"]
               for rd in rounds if _ok(rd.get("pagedjax")) and _ok(rd.get(name))]
        out[name]["pagedjax_speedup_per_round"] = per
        out[name]["pagedjax_speedup"] = float(np.median(per))
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parse_args(argv)
    if ns.worker:
        return worker(ns)
    if not ns.skip_hf:
        found = find_hf_baselines(ns.hf_baselines)
        if found is None:
            print("note: " + NO_HF_SCRIPT.format(script=ns.hf_baselines or HF_SCRIPT),
                  file=sys.stderr)
            ns.skip_hf = True
        ns.hf_baselines = found
    systems = ["pagedjax"] + ([] if ns.skip_hf else ["hf_static"]) + (
        [] if ns.skip_hf or ns.skip_hf_continuous else ["hf_continuous"])
    report: dict = {"benchmark": "throughput", "args": vars(ns), "machine": machine.machine(),
                    "isolation": "each system in its own fresh process; order reversed every "
                                 "other round", "rounds": []}
    with tempfile.TemporaryDirectory(prefix="pagedjax_bench_") as tmp:
        wl = _spawn(ns, argv, "workload", tmp, "workload")
        if "error" in wl:
            raise RuntimeError(f"could not build the workload: {wl['error']}")
        reqs = wl["reqs"]
        ins, outs = [len(p) for p, _ in reqs], [o for _, o in reqs]
        report["workload"] = {
            "name": ns.workload, "num_requests": len(reqs), "seed": ns.seed,
            "shape": "lognormal, sigma 0.8", "sharegpt_means": [SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT],
            "input_len_mean": float(np.mean(ins)), "input_len_max": max(ins),
            "output_len_mean": float(np.mean(outs)), "output_len_max": max(outs),
            "input_lens": ins, "output_lens": outs}
        tokens: dict = {}
        for rnd in range(ns.repeat):
            results = {}
            for name in _order(systems, rnd):
                print(f"[round {rnd + 1}/{ns.repeat}] {name}: {len(reqs)} requests "
                      f"(fresh process) ...", flush=True)
                r = _spawn(ns, argv, name, tmp, f"{name}-{rnd}")
                toks = r.pop("_tokens", None)
                if toks is not None:
                    tokens.setdefault(name, toks)
                results[name] = r
            report["rounds"].append({"order": _order(systems, rnd), "systems": results})
    report["systems"] = combine([rd["systems"] for rd in report["rounds"]], systems)
    pj = report["systems"]["pagedjax"]
    if "sharing" in pj:
        report["sharing"] = pj.pop("sharing")
    if "pagedjax" in tokens:
        report["greedy_agreement_with_pagedjax"] = {
            k: agreement(tokens["pagedjax"], v) for k, v in tokens.items() if k != "pagedjax"}
    report["machine"]["loadavg_end"] = machine.loadavg()
    print_table(report)
    if ns.json:
        write_json(report, ns.json)
    return 0


def print_table(report: dict) -> None:
    sysres = report["systems"]
    pj = sysres.get("pagedjax")
    hdr = (f"{'system':<14} {'out tok/s':>9} {'req/s':>7} {'pagedjax x':>10} "
           f"{'TTFT ms':>9} {'TPOT ms':>8} {'time s':>7}")
    print()
    print(hdr)
    print("-" * len(hdr))

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for name in ("pagedjax", "hf_static", "hf_continuous"):
        r = sysres.get(name)
        if r is None:
            continue
        if "error" in r:
            print(f"{name:<14} {'error: ' + r['error'][:70]}")
            continue
        ratio = r.get("pagedjax_speedup")
        print(f"{name:<14} {r['output_tokens_per_s']:>9.1f} {r['requests_per_s']:>7.3f} "
              f"{num(ratio, '>9.2f') + ('x' if ratio else ''):>10} {num(r['mean_ttft_ms'], '>9.0f')} "
              f"{num(r['mean_tpot_ms'], '>8.1f')} {r['duration_s']:>7.1f}")
    for name in ("hf_static", "hf_continuous"):
        r = sysres.get(name) or {}
        if len(r.get("pagedjax_speedup_per_round", [])) > 1:
            print(f"pagedjax vs {name} per round: "
                  + ", ".join(f"{x:.2f}x" for x in r["pagedjax_speedup_per_round"]))
    wl = report["workload"]
    print(f"\nworkload {wl['name']}: {wl['num_requests']} requests, input mean {wl['input_len_mean']:.0f} "
          f"(max {wl['input_len_max']}), output mean {wl['output_len_mean']:.0f} "
          f"(max {wl['output_len_max']}), seed {wl['seed']}")
    if _ok(pj):
        print(f"pagedjax weights: {pj['quantization'] or 'float'}, "
              f"{pj['weight_bytes'] / 2**20:.1f} MiB (transformers baselines: float32)")
        print(f"pagedjax: warm-up {pj['warmup_s']:.1f} s ({pj['warmup_compilations']} compilations, "
              f"{pj['warmup_shapes'] if pj['warmup_shapes'] is not None else 'full pass'} shapes), "
              f"compilations after warm-up: {pj['compilations_after_warmup']}, "
              f"{pj['num_steps']} steps ({num(pj['mean_step_ms'], '.1f')} ms mean), "
              f"KV waste mean {num(pj['kv_waste_mean'], '.1%')}, "
              f"peak pages {pj['peak_pages_used']}/{pj['num_pages'] - 1}")
    if _ok(pj) and pj.get("step_profile"):
        print("pagedjax step profile (padded shape bucket: steps, time, mean step, mean real rows, tokens):")
        for b in pj["step_profile"]:
            print(f"  {b['kind']:<6} S={b['rows_bucket']:<4} T={b['tokens_bucket']:<5} "
                  f"{b['steps']:>5} steps {b['seconds']:>7.1f} s ({b['share']:>4.0%}) "
                  f"{b['mean_step_ms']:>7.1f} ms {b['mean_rows']:>6.1f} rows {b['tokens']:>7} tokens")
    hs = sysres.get("hf_static")
    if hs and "error" not in hs:
        print(f"hf_static: {hs['useful_fraction']:.0%} of generated tokens are useful "
              f"(batches of {hs['batch_size']} run to their longest output)")
    for k, v in report.get("greedy_agreement_with_pagedjax", {}).items():
        print(f"greedy agreement pagedjax vs {k}: {v:.0%} of output tokens before first divergence")
    sh = report.get("sharing")
    if sh and "error" not in sh:
        print(f"sharing (8 prompts x n=4, prompt {sh['prompt_len']}, output {sh['output_len']}): "
              f"peak pages {sh['n4']['peak_pages_used']} with n=4 vs "
              f"{sh['independent']['peak_pages_used']} independent "
              f"({sh['pages_saved']} saved, {num(sh['saving_fraction'], '.0%')}); "
              f"peak pages_saved_by_sharing {sh['n4']['peak_pages_saved_by_sharing']}")
    elif sh:
        print(f"sharing: error: {sh['error']}")
    print(f"machine: {machine.describe(report['machine'])}; load at the end "
          f"{report['machine']['loadavg_end']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="pagedjax bench throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default model, HF folder or .gguf (both systems)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="sharegpt",
                   help="; ".join(f"{k}: {v['num_requests']} requests, mean {v['input_mean']:.0f} "
                                  f"in / {v['output_mean']:.0f} out" for k, v in WORKLOADS.items()))
    p.add_argument("--num-requests", type=int, default=None, help="default: the workload's")
    p.add_argument("--input-mean", type=float, default=None,
                   help=f"default: the workload's (ShareGPT: {SHAREGPT_MEAN_IN})")
    p.add_argument("--output-mean", type=float, default=None,
                   help=f"default: the workload's (ShareGPT: {SHAREGPT_MEAN_OUT})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of all systems, order reversed every other round")
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="pagedjax max_num_seqs; also HF continuous max_requests_per_batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None, help="default: fits the workload")
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--attention-backend", default="auto",
                   help="pagedjax attention_backend (auto: cpu_native on CPU when it builds)")
    p.add_argument("--prefix-caching", choices=("default", "on", "off"), default="default",
                   help="pagedjax enable_prefix_caching (default: the engine's default)")
    p.add_argument("--quantization", choices=("none", "int8", "gguf"), default="none",
                   help="pagedjax LLM(quantization=...): int8 weights or a GGUF file's own "
                        "quantized tensors kept on the device (the transformers baselines stay "
                        "float32)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPE_CHOICES,
                   help="pagedjax LLM(kv_cache_dtype=...): the KV pool's dtype (auto: the "
                        "model's; llama.cpp's server keeps float16 by default)")
    p.add_argument("--warmup", choices=("shapes", "pass"), default="shapes",
                   help="shapes: compile the step shapes the workload can reach; pass: run the "
                        "workload once untimed")
    p.add_argument("--hf-batch-size", type=int, default=HF_STATIC_BATCH)
    p.add_argument("--hf-baselines", default=None, metavar="PATH",
                   help=f"the transformers baselines' script (default: {HF_SCRIPT} of a "
                        "checkout; the installed package does not ship it)")
    p.add_argument("--skip-hf", action="store_true", help="skip both transformers baselines")
    p.add_argument("--skip-hf-continuous", action="store_true")
    p.add_argument("--skip-sharing", action="store_true")
    p.add_argument("--sharing-prompt-len", type=int, default=None,
                   help="default: max(48, --input-mean)")
    p.add_argument("--sharing-output-len", type=int, default=32)
    p.add_argument("--no-hf-cache", action="store_true",
                   help="do not cache the dequantised transformers model")
    p.add_argument("--json", default=DEFAULT_JSON, help="where to write the JSON report")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: child process
    p.add_argument("--worker-in", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    for k, v in WORKLOADS[ns.workload].items():
        if getattr(ns, k) is None:
            setattr(ns, k, v)
    if ns.repeat < 1:
        p.error(f"--repeat must be >= 1, got {ns.repeat}")
    return ns


def write_json(report: dict, path: str) -> None:
    """Write a benchmark report (creating its folder) and say where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
