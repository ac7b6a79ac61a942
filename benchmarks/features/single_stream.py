"""One stream's decode speed: pagedjax (float32 weights, GGUF blocks) vs llama.cpp's server.

    python benchmarks/features/single_stream.py --llama-server PATH/llama-server
    python benchmarks/features/single_stream.py --llama-server ... --rounds 3 --tokens 128

Every mode runs in a fresh process of its own, the modes' order reversed in
every other round, on the same GGUF file (default: the default model) and
the same prompt, one request of ``--tokens`` greedy tokens, EOS ignored:

* ``none`` / ``gguf``: ``LLM(model, quantization=mode)`` (float32 weights
  dequantized at load / the file's blocks through the C++ block kernel);
  decode tok/s = (tokens - 1) / (time of the request - time of the same
  request with one token), best of 3 after a warm-up that compiles every
  bucket on the way;
* ``llama.cpp:N``: ``llama-server -t N -np 1`` on the same file
  (benchmarks/serving/llama_server.py) (N threads;
  ``llama.cpp`` alone: ``--threads``), its ``/completion`` answer's own
  ``timings.predicted_per_second`` (prompt cache off), best of 3 after a
  warm-up request.

Weight memory: the engine's ``weight_bytes`` for pagedjax; for llama.cpp the
GGUF file's tensor bytes (it maps the file's blocks as its weights). pagedjax's
host CPU a token: the engine thread's CPU time (``time.thread_time``) over the
same difference of requests, the host work that shares the cores with the
kernels' threads. Prints a table per round, then each pagedjax mode's rate over
each llama.cpp mode's, per round and their median, and writes JSON (default
benchmarks/results/single_stream.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "single_stream.json")
if ROOT not in sys.path:  # benchmarks.serving, when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.serving import llama_server  # noqa: E402
PROMPT = "Tell me a long story about a lighthouse keeper and the sea."


def _pagedjax_child(model: str | None, mode: str, tokens: int) -> dict:
    from pagedjax import LLM, SamplingParams

    llm = LLM(model, quantization=mode, max_num_seqs=4, max_model_len=512, cpu_kv_cache_gib=0.25)

    def gen(n):
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        t, c = time.perf_counter(), time.thread_time()
        out = llm.generate([PROMPT], sp, use_tqdm=False)
        return time.perf_counter() - t, time.thread_time() - c, out[0]
    gen(tokens), gen(1)  # compile every bucket on the way
    t_full, c_full, _ = min((gen(tokens) for _ in range(3)), key=lambda g: g[0])
    t_one, c_one, _ = min((gen(1) for _ in range(3)), key=lambda g: g[0])
    out = gen(tokens)[2]
    eng = llm.llm_engine
    return {"mode": mode, "weight_bytes": int(eng.weight_bytes),
            "block_matmul_rows": eng.runner.plan.block_matmul_rows,
            "prompt_tokens": len(out.prompt_token_ids),
            "decode_tok_s": (tokens - 1) / max(t_full - t_one, 1e-9),
            # the engine's own thread (the host work beside the kernels' threads)
            "host_cpu_ms_per_token": (c_full - c_one) / (tokens - 1) * 1e3}


def _llama_cpp(server: str, gguf: str, tokens: int, threads: int) -> dict:
    with llama_server.running(server, gguf, slots=1, ctx=1024, threads=threads,
                              log_path=os.devnull) as url:
        llama_server.completion(url, PROMPT, tokens)  # warm-up
        runs = [llama_server.completion(url, PROMPT, tokens)["timings"] for _ in range(3)]
    best = max(runs, key=lambda t: t["predicted_per_second"])
    return {"mode": f"llama.cpp:{threads}", "weight_bytes": llama_server.gguf_tensor_bytes(gguf),
            "prompt_tokens": best["prompt_n"], "predicted_n": best["predicted_n"],
            "decode_tok_s": best["predicted_per_second"]}


def _run(mode: str, ns) -> dict:
    if mode.startswith("llama.cpp"):
        threads = int(mode.split(":")[1]) if ":" in mode else ns.threads
        return _llama_cpp(ns.llama_server, ns.gguf, ns.tokens, threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--tokens", str(ns.tokens)]
    if ns.model:
        cmd += ["--model", ns.model]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    if r.returncode or not line:
        raise SystemExit(f"{mode} failed:\n{r.stderr[-3000:]}")
    return json.loads(line[0][len("RESULT"):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    llama_server.add_args(ap)
    ap.add_argument("--modes", default="none,gguf,llama.cpp")
    # e.g. none,gguf,llama.cpp:1,llama.cpp:2
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.child:
        print("RESULT" + json.dumps(_pagedjax_child(ns.model, ns.child, ns.tokens)))
        return 0
    modes = ns.modes.split(",")
    llama_server.resolve_args(ap, ns, needed=any(m.startswith("llama.cpp") for m in modes))
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    rounds = []
    for i in range(ns.rounds):
        res = {}
        for m in (modes if i % 2 == 0 else modes[::-1]):
            res[m] = _run(m, ns)
            print(f"  {m}: {res[m]['decode_tok_s']:.1f} tok/s (load {os.getloadavg()[0]:.1f})",
                  flush=True)
        rounds.append(res)
        print(f"round {i + 1} (order: {', '.join(res)})")
        print("  mode        weights MiB  decode tok/s  prompt tokens  host CPU ms/token")
        for m, r in res.items():
            host = r.get("host_cpu_ms_per_token")
            print(f"  {m:<10} {r['weight_bytes'] / 2**20:>12.1f} {r['decode_tok_s']:>13.1f}"
                  f" {r['prompt_tokens']:>14} {'' if host is None else f'{host:.2f}':>17}")
        sys.stdout.flush()
    ratios = {}  # pagedjax mode / llama.cpp mode, each round's own
    for a in (m for m in modes if not m.startswith("llama.cpp")):
        for b in (m for m in modes if m.startswith("llama.cpp")):
            ratios[f"{a} / {b}"] = [r[a]["decode_tok_s"] / r[b]["decode_tok_s"] for r in rounds]
    for name, rs in ratios.items():
        print(f"{name}: median {statistics.median(rs):.3f} over {len(rs)} rounds "
              f"[{min(rs):.3f}-{max(rs):.3f}]")
    report = {"benchmark": "single_stream", "args": {k: v for k, v in vars(ns).items()},
              "date": time.strftime("%Y-%m-%d"), "machine": os.uname().nodename,
              "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "rounds": rounds,
              "ratios": ratios}
    with open(ns.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {ns.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
