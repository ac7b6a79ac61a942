"""Online serving benchmark: Poisson arrivals against an OpenAI-compatible server.

    pagedjax bench serving                      # starts a local server itself
    pagedjax bench serving --base-url http://127.0.0.1:8000 --request-rates 1,4,inf
    pagedjax bench serving --num-prompts 16

Workload: ShareGPT-shaped random lengths (lognormal around the vLLM paper's
ShareGPT means, 161 input / 338 output tokens) scaled down by ``--scale`` for
2 CPU cores; prompts are random token ids and ``ignore_eos`` holds each
output to its drawn length. For every request rate (``inf`` = all at once) it
reports request throughput, output tokens/s, TTFT, TPOT and inter-token
latency (mean, median, p99) and failed requests; prints a table and writes
JSON to benchmarks/results/serving.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np

SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT = 161, 338


def make_workload(n: int, scale: float, max_model_len: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    sigma = 0.8  # ShareGPT lengths are long-tailed

    def draw(mean):
        mu = math.log(max(mean * scale, 1.0)) - sigma ** 2 / 2
        return np.maximum(1, rng.lognormal(mu, sigma, n).round().astype(int))

    ins, outs = draw(SHAREGPT_MEAN_IN), draw(SHAREGPT_MEAN_OUT)
    reqs = []
    for i, o in zip(ins, outs):
        i = int(min(i, max_model_len // 2))
        o = int(min(o, max_model_len - i - 1))
        reqs.append((rng.integers(100, min(vocab, 30000), i).tolist(), max(1, o)))
    return reqs


async def one_request(client, model, prompt_ids, max_tokens, t_start, results):
    rec = {"prompt_len": len(prompt_ids), "max_tokens": max_tokens, "ok": False, "ttft": None,
           "itl": [], "output_tokens": 0, "latency": None, "error": None}
    t0 = time.perf_counter()
    last = None
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt_ids, max_tokens=max_tokens, temperature=0.0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                rec["output_tokens"] = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].text:
                if rec["ttft"] is None:
                    rec["ttft"] = now - t0
                else:
                    rec["itl"].append(now - last)
                last = now
        rec["latency"] = time.perf_counter() - t0
        rec["ok"] = rec["ttft"] is not None
        if not rec["ok"]:
            rec["error"] = "no tokens received"
    except Exception as e:  # noqa: BLE001 - counted as a failed request
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["end"] = time.perf_counter() - t_start
    results.append(rec)


def _stats(xs, scale=1000.0):
    if not xs:
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(xs) * scale
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "p99": float(np.percentile(a, 99))}


async def run_rate(base_url, api_key, model, workload, rate, seed, timeout):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key or "none", timeout=timeout,
                         max_retries=0)
    rng = np.random.default_rng(seed)
    results: list = []
    tasks = []
    t_start = time.perf_counter()
    for prompt, mt in workload:
        tasks.append(asyncio.create_task(one_request(client, model, prompt, mt, t_start, results)))
        if math.isfinite(rate):
            await asyncio.sleep(rng.exponential(1.0 / rate))
    await asyncio.gather(*tasks)
    dur = time.perf_counter() - t_start
    await client.close()
    ok = [r for r in results if r["ok"]]
    out_tok = sum(r["output_tokens"] for r in ok)
    tpots = [(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok
             if r["output_tokens"] > 1]
    return {
        "request_rate": "inf" if not math.isfinite(rate) else rate,
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if r["error"]})[:5],
        "duration_s": dur, "request_throughput": len(ok) / dur,
        "output_throughput": out_tok / dur,
        "total_input_tokens": sum(r["prompt_len"] for r in ok), "total_output_tokens": out_tok,
        "ttft_ms": _stats([r["ttft"] for r in ok]), "tpot_ms": _stats(tpots),
        "itl_ms": _stats([x for r in ok for x in r["itl"]]),
        "e2e_ms": _stats([r["latency"] for r in ok]),
    }


def _get(url, api_key=None, timeout=5.0):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"}
                                 if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def start_server(ns) -> tuple[subprocess.Popen, str]:
    port = ns.port
    cmd = [sys.executable, "-m", "pagedjax.entrypoints.openai.api_server", "--port", str(port),
           "--max-model-len", str(ns.max_model_len), "--max-num-seqs", str(ns.max_num_seqs),
           "--log-level", "warning"]
    if ns.model:
        cmd += ["--model", ns.model]
    if ns.num_pages:
        cmd += ["--num-pages", str(ns.num_pages)]
    if ns.enable_prefix_caching:
        cmd.append("--enable-prefix-caching")
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + ns.startup_timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if _get(f"{url}/health")[0] == 200:
                return proc, url
        except OSError:
            time.sleep(1.0)
    proc.kill()
    raise RuntimeError("server did not become healthy in time")


def print_table(rows) -> None:
    hdr = (f"{'rate':>6} {'ok/fail':>8} {'req/s':>7} {'out tok/s':>9} {'TTFT mean/med/p99 ms':>24} "
           f"{'TPOT mean/med/p99 ms':>22} {'ITL mean/med/p99 ms':>22}")
    print(hdr)
    print("-" * len(hdr))

    def f(s):
        return "/".join("-" if s[k] is None else f"{s[k]:.0f}" for k in ("mean", "median", "p99"))

    for r in rows:
        print(f"{str(r['request_rate']):>6} {r['completed']:>4}/{r['failed']:<3} "
              f"{r['request_throughput']:>7.2f} {r['output_throughput']:>9.1f} "
              f"{f(r['ttft_ms']):>24} {f(r['tpot_ms']):>22} {f(r['itl_ms']):>22}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="pagedjax bench serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="a running server; else one is started")
    p.add_argument("--api-key", default=os.environ.get("PAGEDJAX_API_KEY"))
    p.add_argument("--served-model", default=None, help="model name (default: first of /v1/models)")
    p.add_argument("--num-prompts", type=int, default=24, help="requests per rate")
    p.add_argument("--request-rates", default="0.5,1,2,inf",
                   help="comma-separated requests/s; inf = all at once")
    p.add_argument("--scale", type=float, default=0.15,
                   help="ShareGPT length scale (0.15 -> ~24 input / ~51 output tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    p.add_argument("--output", default=os.path.join("benchmarks", "results", "serving.json")
                   if os.path.isdir("benchmarks") else "pagedjax_serving.json")
    g = p.add_argument_group("server started when --base-url is absent (mirrors LLM(...))")
    g.add_argument("--model", default=None)
    g.add_argument("--port", type=int, default=8123)
    g.add_argument("--max-model-len", type=int, default=512)
    g.add_argument("--max-num-seqs", type=int, default=32)
    g.add_argument("--num-pages", type=int, default=None)
    g.add_argument("--enable-prefix-caching", action="store_true")
    g.add_argument("--startup-timeout", type=float, default=300.0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    ns = parse_args(argv)
    proc = None
    base = ns.base_url
    if base is None:
        proc, base = start_server(ns)
    base = base.rstrip("/").removesuffix("/v1")
    try:
        models = json.loads(_get(f"{base}/v1/models", ns.api_key)[1])["data"]
        model = ns.served_model or models[0]["id"]
        mml = models[0].get("max_model_len") or ns.max_model_len
        workload = make_workload(ns.num_prompts, ns.scale, mml, 49152, ns.seed)
        # Warm-up: compile the common shapes outside the measurement.
        asyncio.run(run_rate(base, ns.api_key, model, workload[:4], float("inf"), ns.seed,
                             ns.timeout))
        rows = []
        for r in ns.request_rates.split(","):
            rate = float(r)
            print(f"request rate {r}: {len(workload)} requests ...", flush=True)
            rows.append(asyncio.run(run_rate(base, ns.api_key, model, workload, rate, ns.seed,
                                             ns.timeout)))
        print_table(rows)
        os.makedirs(os.path.dirname(ns.output), exist_ok=True)
        with open(ns.output, "w") as f:
            json.dump({"model": model, "base_url": base, "num_prompts": ns.num_prompts,
                       "scale": ns.scale, "mean_input_tokens": float(np.mean([len(p) for p, _ in workload])),
                       "mean_output_tokens": float(np.mean([m for _, m in workload])),
                       "results": rows}, f, indent=2)
        print(f"wrote {ns.output}")
        return 0 if all(r["failed"] == 0 for r in rows) else 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
