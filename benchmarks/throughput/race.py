"""The offline CPU race: pagedjax (float32 weights, GGUF blocks) against llama.cpp's
server (16 and 64 slots) and transformers (static batches of 16, continuous batching).

    python benchmarks/throughput/race.py --llama-server PATH/llama-server --rounds 2
    python benchmarks/throughput/race.py --llama-server ... --workloads sharegpt \\
        --requests 8 --rounds 1 --systems pagedjax_f32,llama_16      # a smoke run

For each workload (``sharegpt`` and ``long``, as ``pagedjax bench throughput``
defines them, pagedjax/benchmarks/workload.py) every system runs the same prompt
token ids with the same output lengths (EOS ignored, greedy), all requests sent at
once, each system in a fresh process of its own, the systems' order reversed every
other round:

* ``pagedjax_f32`` / ``pagedjax_gguf``: ``pagedjax bench throughput``'s pagedjax
  worker (``LLMEngine``, continuous batching, warmed up on the workload's step
  shapes) with ``quantization="none"`` (the GGUF file dequantized to float32 at
  load) / ``"gguf"`` (the file's blocks through the C++ block kernel), the KV cache
  float32 (the model's dtype); ``pagedjax_gguf_kv16``: the blocks with
  ``kv_cache_dtype="float16"``;
* ``llama_16`` / ``llama_64``: ``llama-server -c SLOTS*CTX -np SLOTS -cb -t THREADS
  -ctk f16 -ctv f16`` (its default cache type, stated) on the same GGUF file
  (benchmarks/serving/llama_server.py), started fresh, warmed with a few requests,
  then every request posted at once to ``/completion`` (its queue holds what the
  slots cannot take yet); output tokens are the server's own ``tokens_predicted``;
  ``llama_16_kv32`` / ``llama_64_kv32``: the same with ``-ctk f32 -ctv f32``;
* ``hf_static`` / ``hf_continuous``: benchmarks/throughput/hf_baselines.py
  (transformers ``generate`` on static batches of 16; transformers' continuous
  batching), float32.

Reported per workload: each system's output tok/s in every round and their median,
and per round each system's rate over pagedjax's best mode in that round among the
modes whose KV cache takes at least as many bytes as the system's (a float16 cache
reads half the bytes of a float32 one in a long decode, so pagedjax with float16 KV
is measured against llama.cpp's float16 cache only, never against a float32 cache):
the figure to quote on a shared machine.
Weight memory of every mode, the load average around every run and the machine go
into the JSON (default benchmarks/results/race.json).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.serving import llama_server  # noqa: E402
from pagedjax.benchmarks import machine  # noqa: E402
from pagedjax.benchmarks.throughput import (  # noqa: E402
    batched_tokens,
    find_hf_baselines,
    hf_command,
    run_worker,
    write_json,
)
from pagedjax.benchmarks.workload import WORKLOADS, agreement, summary  # noqa: E402

# pagedjax systems: (quantization, kv_cache_dtype); llama.cpp's: (slots, its cache type)
PAGEDJAX = {"pagedjax_f32": ("none", "auto"), "pagedjax_gguf": ("gguf", "auto"),
            "pagedjax_gguf_kv16": ("gguf", "float16")}
LLAMA = {"llama_16": (16, "f16"), "llama_64": (64, "f16"),
         "llama_16_kv32": (16, "f32"), "llama_64_kv32": (64, "f32")}
HF = ("hf_static", "hf_continuous")
SYSTEMS = (*PAGEDJAX, *LLAMA, *HF)
DEFAULT_SYSTEMS = ("pagedjax_f32", "pagedjax_gguf", "pagedjax_gguf_kv16", "llama_16", "llama_64",
                   "hf_static", "hf_continuous")


def kv_bytes(system: str) -> int:
    """Bytes a cached key or value element takes in the system's KV cache (pagedjax's
    `auto` and transformers': the float32 model's own)."""
    if system in PAGEDJAX:
        return 2 if PAGEDJAX[system][1] == "float16" else 4
    if system in LLAMA:
        return 2 if LLAMA[system][1] == "f16" else 4
    return 4
DEFAULT_JSON = os.path.join("benchmarks", "results", "race.json")


def _workload_argv(ns, workload: str) -> list[str]:
    argv = ["--workload", workload, "--max-num-seqs", str(ns.max_num_seqs), "--seed", str(ns.seed)]
    if ns.requests:
        argv += ["--num-requests", str(ns.requests)]
    return argv + (["--model", ns.model] if ns.model else [])


def make_workload(ns, workload: str, tmp: str) -> str:
    """The workload's requests, written by a fresh worker -> the file's path."""
    path = os.path.join(tmp, f"{workload}.json")
    res = run_worker([sys.executable, "-m", "pagedjax.benchmarks.throughput",
                      *_workload_argv(ns, workload), "--worker", "workload",
                      "--worker-out", path], path, "workload")
    if "error" in res:
        raise SystemExit(f"could not build the {workload} workload: {res['error']}")
    return path


def run_pagedjax(ns, system: str, workload: str, wl_path: str, out: str) -> dict:
    cmd = [sys.executable, "-m", "pagedjax.benchmarks.throughput", *_workload_argv(ns, workload),
           "--quantization", PAGEDJAX[system][0], "--kv-cache-dtype", PAGEDJAX[system][1],
           "--skip-sharing", "--quiet",
           "--worker", "pagedjax", "--worker-in", wl_path, "--worker-out", out]
    res = run_worker(cmd, out, system)
    res["system"] = system
    return res


def run_hf(ns, system: str, wl_path: str, out: str) -> dict:
    return run_worker(hf_command(ns, system, wl_path, out), out, system)


def run_llama(ns, system: str, reqs: list, tmp: str) -> dict:
    """llama-server with the system's slots: warm-up, then every request at once."""
    slots, cache = LLAMA[system]
    extra = ("-ctk", cache, "-ctv", cache)
    ctx = -(-(max(len(p) + o for p, o in reqs) + 8) // 64) * 64
    load0, t_start = machine.loadavg(), time.time()
    with llama_server.running(ns.llama_server, ns.gguf, slots=slots, ctx=ctx,
                              threads=ns.threads, log_path=os.path.join(tmp, f"{system}.log"),
                              timeout=ns.start_timeout, extra=extra) as url:
        started_s = time.time() - t_start
        warm = reqs[:min(len(reqs), 4)]
        with concurrent.futures.ThreadPoolExecutor(len(warm)) as pool:
            list(pool.map(lambda r: llama_server.completion(url, r[0][:16], 4), warm))
        with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
            t0 = time.perf_counter()

            def one(req):
                ans = llama_server.completion(url, req[0], req[1])
                return ans, time.perf_counter()
            answers = list(pool.map(one, reqs))
            duration = max(t for _, t in answers) - t0
    got = [int(a["tokens_predicted"]) for a, _ in answers]
    bad = [(i, o, g) for i, ((_, o), g) in enumerate(zip(reqs, got)) if g != o]
    if bad:  # a rate over other output lengths than pagedjax's is no comparison
        raise RuntimeError(f"{system}: requests (index, asked, generated) {bad[:5]} did not "
                           f"generate the workload's output lengths")
    prompt_n = [int(a["timings"]["prompt_n"]) for a, _ in answers]
    res = summary(system, reqs, duration, [], [], slots=slots, ctx_per_slot=ctx,
                  threads=ns.threads, start_s=started_s, cache_type=cache,
                  weight_bytes=llama_server.gguf_tensor_bytes(ns.gguf),
                  server_output_tokens=sum(got),
                  prompt_tokens_evaluated=sum(prompt_n),
                  command=llama_server.command(ns.llama_server, ns.gguf, 0, slots=slots,
                                               ctx=ctx, threads=ns.threads, extra=extra))
    # the server's own count of the tokens it generated (equal to the workload's
    # when every request ran to its length)
    res["output_tokens"] = sum(got)
    res["output_tokens_per_s"] = sum(got) / duration
    res["_tokens"] = [list(a.get("tokens") or []) for a, _ in answers]
    res["process"] = {"loadavg_before": load0, "loadavg_after": machine.loadavg(),
                      "wall_s": time.time() - t_start}
    return res


def run_system(ns, system: str, workload: str, wl_path: str, reqs: list, tmp: str,
               tag: str) -> dict:
    out = os.path.join(tmp, f"{tag}.json")
    if system in PAGEDJAX:
        return run_pagedjax(ns, system, workload, wl_path, out)
    if system in LLAMA:
        try:
            return run_llama(ns, system, reqs, tmp)
        except (OSError, RuntimeError, KeyError, ValueError) as e:  # a failed peer is a result
            return {"system": system, "error": f"{type(e).__name__}: {e}"}
    return run_hf(ns, system, wl_path, out)


def _ok(r: dict | None) -> bool:
    return r is not None and "error" not in r


def rivals(name: str) -> list[str]:
    """The pagedjax modes a system is measured against: those whose KV cache takes at
    least as many bytes an element as its own (a smaller cache would be a lighter
    set-up than the peer's: pagedjax float16 KV is compared with llama.cpp's float16
    cache, not with its float32 one or transformers')."""
    return [p for p in PAGEDJAX if kv_bytes(p) >= kv_bytes(name)]


def compare(rounds: list[dict], systems: list[str]) -> dict:
    """Per system its rates and their median; per round its rate over pagedjax's best
    mode of that round among its rivals (same or larger KV cache), and the median of
    those ratios."""
    out = {}
    for name in systems:
        rates = [rd[name]["output_tokens_per_s"] for rd in rounds if _ok(rd.get(name))]
        ratios = []
        for rd in rounds:
            best = max((rd[p]["output_tokens_per_s"] for p in rivals(name) if _ok(rd.get(p))),
                       default=None)
            if best and _ok(rd.get(name)):
                ratios.append(rd[name]["output_tokens_per_s"] / best)
        errors = [rd[name]["error"] for rd in rounds if name in rd and not _ok(rd[name])]
        out[name] = {"tok_s": rates, "tok_s_median": statistics.median(rates) if rates else None,
                     "vs_best_pagedjax": ratios,
                     "vs_best_pagedjax_median": statistics.median(ratios) if ratios else None,
                     "pagedjax_best_over_this": [1 / r for r in ratios],
                     "errors": errors}
    return out


def table(workload: str, cmp: dict, rounds: list[dict]) -> str:
    n = len(rounds)
    head = (f"{'system':<19}" + "".join(f"{'r' + str(i + 1) + ' tok/s':>11}" for i in range(n))
            + f"{'median':>9}" + "".join(f"{'r' + str(i + 1) + ' /best pj':>12}" for i in range(n))
            + f"{'best pj / this':>16}{'weights MiB':>13}{'KV':>5}")
    lines = [f"workload {workload}", head, "-" * len(head)]
    for name, c in cmp.items():
        runs = [rd.get(name) for rd in rounds]
        w = next((r.get("weight_bytes") for r in runs if _ok(r) and r.get("weight_bytes")), None)
        rates = "".join(f"{r['output_tokens_per_s']:>11.1f}" if _ok(r) else f"{'error':>11}"
                        for r in runs)
        ratios = "".join(f"{x:>11.2f}x" for x in c["vs_best_pagedjax"])
        ratios += " " * 12 * (n - len(c["vs_best_pagedjax"]))
        med = c["vs_best_pagedjax_median"]
        lines.append(f"{name:<19}{rates}{c['tok_s_median'] or 0:>9.1f}{ratios}"
                     f"{(1 / med if med else 0):>15.2f}x"
                     f"{(w / 2**20 if w else float('nan')):>13.1f}"
                     f"{('f16' if kv_bytes(name) == 2 else 'f32'):>5}")
        for e in c["errors"]:
            lines.append(f"  {name} error: {e[:150]}")
    lines.append("order per round: " + "; ".join(" > ".join(rd["order"]) for rd in rounds))
    lines.append("best pj: the fastest pagedjax mode whose KV cache (column KV) is at least "
                 "the system's; goals: best pagedjax / llama_16 and llama_64 >= 2x, / hf_static "
                 ">= 5x")
    return "\n".join(lines)


def race_workload(ns, workload: str, tmp: str) -> dict:
    wl_path = make_workload(ns, workload, tmp)
    with open(wl_path) as f:
        reqs = [(list(p), int(o)) for p, o in json.load(f)["reqs"]]
    rounds, tokens = [], {}
    for rnd in range(ns.rounds):
        order = ns.systems if rnd % 2 == 0 else ns.systems[::-1]
        rd = {"order": list(order)}
        for system in order:
            print(f"[{workload} round {rnd + 1}/{ns.rounds}] {system}: {len(reqs)} requests "
                  f"(fresh process) ...", flush=True)
            r = run_system(ns, system, workload, wl_path, reqs, tmp, f"{workload}-{system}-{rnd}")
            toks = r.pop("_tokens", None)
            if toks:
                tokens.setdefault(system, toks)
            r.pop("step_profile", None)
            rd[system] = r
        rounds.append(rd)
    cmp = compare(rounds, ns.systems)
    ins, outs = [len(p) for p, _ in reqs], [o for _, o in reqs]
    ref = tokens.get("pagedjax_f32")
    return {"workload": workload, "num_requests": len(reqs), "input_tokens": sum(ins),
            "output_tokens": sum(outs), "input_len_max": max(ins), "output_len_max": max(outs),
            "rounds": rounds, "comparison": cmp,
            "greedy_agreement_with_pagedjax_f32": {k: agreement(ref, v) for k, v in tokens.items()
                                                   if ref and k != "pagedjax_f32"}}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    llama_server.add_args(p)
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help=f"of {', '.join(SYSTEMS)} (default: {', '.join(DEFAULT_SYSTEMS)})")
    p.add_argument("--workloads", default="sharegpt,long", help=f"of {', '.join(WORKLOADS)}")
    p.add_argument("--requests", type=int, default=None, help="default: each workload's own")
    p.add_argument("--rounds", type=int, default=2, help="order reversed every other round")
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="pagedjax max_num_seqs; transformers continuous batch width")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--hf-baselines", default=None, help="default: this checkout's")
    p.add_argument("--no-hf-cache", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--json", default=DEFAULT_JSON)
    ns = p.parse_args(argv)
    ns.systems = [s for s in ns.systems.split(",") if s]
    ns.workloads = [w for w in ns.workloads.split(",") if w]
    unknown = [s for s in ns.systems if s not in SYSTEMS] + [
        w for w in ns.workloads if w not in WORKLOADS]
    if unknown or not ns.systems or not ns.workloads:
        p.error(f"--systems / --workloads: unknown or empty {unknown}; systems are "
                f"{', '.join(SYSTEMS)}, workloads {', '.join(WORKLOADS)}")
    if ns.rounds < 1 or (ns.requests is not None and ns.requests < 1):
        p.error("--rounds and --requests must be at least 1")
    llama_server.resolve_args(p, ns, needed=any(s in LLAMA for s in ns.systems))
    if any(s in HF for s in ns.systems):
        ns.hf_baselines = find_hf_baselines(ns.hf_baselines)
        if not ns.hf_baselines:
            p.error("--hf-baselines: benchmarks/throughput/hf_baselines.py not found")
    ns.max_num_batched_tokens = batched_tokens(ns.max_num_seqs)
    return ns


def main(argv=None) -> int:
    ns = parse_args(argv)
    report = {"benchmark": "race", "args": vars(ns), "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": machine.machine(), "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="pagedjax_race_") as tmp:
        for workload in ns.workloads:
            res = race_workload(ns, workload, tmp)
            report["workloads"][workload] = res
            print(table(workload, res["comparison"], res["rounds"]), flush=True)
    report["machine"]["loadavg_end"] = machine.loadavg()
    print(f"machine: {machine.describe(report['machine'])}")
    write_json(report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
