"""``pagedjax bench serve``: an online serving benchmark for any OpenAI-compatible server.

    pagedjax bench serve --base-url http://127.0.0.1:8000 --num-prompts 100 \\
        --request-rate 4 --random-input-len 256 --random-output-len 128
    pagedjax bench serve --base-url http://127.0.0.1:8080 --endpoint /v1/chat/completions \\
        --dataset-name sharegpt --dataset-path sharegpt.json --max-concurrency 8
    pagedjax bench serve --start-server --server-args "--max-num-seqs 32" \\
        --dataset-name sharegpt-lengths --request-rate 0.5 1 2 inf --warmup-prompts 4

Requests stream from ``/v1/completions`` (or chat completions) at a Poisson
rate (``--request-rate``, ``inf`` = all at once, several values = one run
each; ``--burstiness`` shapes the gaps as a gamma distribution, 1 = Poisson)
and/or with at most ``--max-concurrency`` in flight, against one or several
``--base-url`` s, or against a pagedjax server the command starts and stops
itself (``--start-server``, its options in ``--server-args``).
``--warmup-prompts`` requests go to each server first, unmeasured.
``ignore_eos`` (understood by pagedjax, vLLM and llama.cpp's server) holds each
output to its length. Token counts come from the server's own ``usage``, so
no tokenizer is needed. The report (vLLM's: throughput, TTFT, TPOT, ITL, E2EL
percentiles, goodput under ``--goodput`` SLOs) is printed as a table and
written as JSON with ``--save-result``; several runs are compared side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import datetime
from typing import Optional

from pagedjax.benchmarks.serve_data import (BenchRequest, random_requests,
                                             sharegpt_length_requests, sharegpt_requests)
from pagedjax.benchmarks.serve_metrics import (METRICS, RequestResult, parse_goodput,
                                               summarize, table)
from pagedjax.benchmarks.serve_server import free_port, pagedjax_command, start, stop

DATASETS = ["random", "sharegpt", "sharegpt-lengths"]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", nargs="+", default=None,
                   help="server root(s) (default http://HOST:PORT); several: the same "
                        "workload against each in turn, compared in one report")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions",
                   choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--model", default=None, help="default: the first of GET /v1/models")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--start-server", action="store_true",
                   help="start a pagedjax server for the run (stopped after), instead of "
                        "--base-url")
    p.add_argument("--server-args", default="",
                   help="options of the started server, one string (e.g. '--model M "
                        "--max-num-seqs 32')")
    p.add_argument("--server-start-timeout", type=float, default=900.0)
    p.add_argument("--warmup-prompts", type=int, default=0,
                   help="requests sent to each server first, not measured")
    p.add_argument("--dataset-name", default="random", choices=DATASETS)
    p.add_argument("--dataset-path", default=None, help="ShareGPT JSON file")
    p.add_argument("--sharegpt-lengths-scale", type=float, default=0.15,
                   help="sharegpt-lengths: ShareGPT's mean lengths times this (0.15: ~24 in "
                        "/ ~51 out tokens)")
    p.add_argument("--sharegpt-lengths-max-len", type=int, default=512,
                   help="sharegpt-lengths: input + output at most this")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--sharegpt-output-len", type=int, default=None)
    p.add_argument("--request-rate", type=float, nargs="+", default=[float("inf")],
                   help="requests/s (inf: all at once); several: one run each")
    p.add_argument("--request-rates", default=None, help=argparse.SUPPRESS)  # a,b,c (older)
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el")
    p.add_argument("--metric-percentiles", default="99")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--label", nargs="+", default=None,
                   help="name of each server in the report (default: its URL)")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename", default=None)
    p.add_argument("--disable-tqdm", action="store_true")


def _body(ns, model: str, req: BenchRequest) -> dict:
    body = {"model": model, "max_tokens": req.output_len, "temperature": ns.temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if ns.ignore_eos:
        body["ignore_eos"] = True
    if ns.endpoint.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


def _piece(chunk: dict) -> str:
    for c in chunk.get("choices") or []:
        d = c.get("delta")
        text = (d.get("content") or d.get("reasoning_content") or "") if d else c.get("text")
        if text:
            return text
    return ""


async def one_request(client, url: str, headers: dict, body: dict, timeout: float
                      ) -> RequestResult:
    r = RequestResult()
    t0 = time.perf_counter()
    last, chunks = None, 0
    try:
        async with client.stream("POST", url, json=body, headers=headers,
                                 timeout=timeout) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    r.error = str(chunk["error"])[:200]
                    return r
                now = time.perf_counter()
                if _piece(chunk):
                    if last is None:
                        r.ttft = now - t0
                    else:
                        r.itl.append(now - last)
                    last, chunks = now, chunks + 1
                u = chunk.get("usage")
                if u:
                    r.prompt_len, r.output_len = u["prompt_tokens"], u["completion_tokens"]
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        r.error = f"{type(e).__name__}: {e}"[:200]
        return r
    r.e2el = time.perf_counter() - t0
    r.output_len = r.output_len or chunks
    r.ok = last is not None
    if not r.ok:
        r.error = "no tokens in the stream"
    return r


async def _arrivals(n: int, rate: float, burstiness: float, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    for i in range(n):
        yield i
        if rate != float("inf") and i + 1 < n:
            theta = 1.0 / (rate * burstiness)
            await asyncio.sleep(float(rng.gamma(burstiness, theta)))


async def run(ns, model: str, requests: list[BenchRequest]) -> tuple[list[RequestResult], float]:
    import httpx
    from tqdm.auto import tqdm

    url = ns.base_url.rstrip("/") + ns.endpoint
    headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else {}
    sem = asyncio.Semaphore(ns.max_concurrency) if ns.max_concurrency else None
    bar = tqdm(total=len(requests), desc="bench serve", disable=ns.disable_tqdm)
    results: list[Optional[RequestResult]] = [None] * len(requests)
    limits = httpx.Limits(max_connections=ns.max_concurrency or len(requests) or 1)

    async with httpx.AsyncClient(limits=limits, timeout=ns.timeout) as client:
        async def task(i: int):
            if sem is not None:
                async with sem:
                    results[i] = await one_request(client, url, headers,
                                                   _body(ns, model, requests[i]), ns.timeout)
            else:
                results[i] = await one_request(client, url, headers,
                                               _body(ns, model, requests[i]), ns.timeout)
            bar.update(1)

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(task(i)) async for i in
                 _arrivals(len(requests), ns.request_rate, ns.burstiness, ns.seed)]
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    bar.close()
    return [r for r in results if r is not None], duration


def first_model(base_url: str, api_key: Optional[str]) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30.0)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def check_args(ns) -> None:
    if getattr(ns, "request_rates", None):
        try:
            ns.request_rate = [float(x) for x in ns.request_rates.split(",")]
        except ValueError:
            raise ValueError("--request-rates: comma-separated numbers (inf: all at once)"
                             ) from None
        ns.request_rates = None
    if not isinstance(ns.request_rate, list):
        ns.request_rate = [ns.request_rate]
    if ns.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    if ns.warmup_prompts < 0:
        raise ValueError("--warmup-prompts must be >= 0")
    if not all(r > 0 for r in ns.request_rate):
        raise ValueError("--request-rate must be > 0 (inf: all at once)")
    if ns.start_server and ns.base_url:
        raise ValueError("give --base-url or --start-server, not both")
    if ns.burstiness <= 0:
        raise ValueError("--burstiness must be > 0")
    if ns.max_concurrency is not None and ns.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if ns.dataset_name == "sharegpt" and not ns.dataset_path:
        raise ValueError("--dataset-name sharegpt needs --dataset-path")
    bad = set(ns.percentile_metrics.split(",")) - set(METRICS)
    if bad:
        raise ValueError(f"--percentile-metrics: unknown {sorted(bad)}; use {sorted(METRICS)}")


def benchmark(ns) -> dict:
    """Run the benchmark of ``ns`` (parsed options) against each server and at each
    request rate; the report as a dict (with several runs: ``{"servers": [report, ...]}``)."""
    check_args(ns)
    proc = None
    if ns.start_server:
        port = free_port()
        urls = [f"http://127.0.0.1:{port}"]
        print(f"starting a pagedjax server on port {port} ...", flush=True)
        proc = start(pagedjax_command(port, ns.server_args), urls[0], ns.server_start_timeout)
    else:
        urls = ns.base_url or [f"http://{ns.host}:{ns.port}"]
    labels = ns.label or (["pagedjax (started)"] if proc else urls)
    try:
        if len(labels) != len(urls):
            raise ValueError(f"give one --label per --base-url ({len(urls)}), got {len(labels)}")
        reports = []
        for url, label in zip(urls, labels):
            if ns.warmup_prompts:
                warm_up(argparse.Namespace(**{**vars(ns), "base_url": url}))
            for rate in ns.request_rate:
                name = label if len(ns.request_rate) == 1 else f"{label} @ {rate:g}/s"
                one = argparse.Namespace(**{**vars(ns), "base_url": url, "label": name,
                                            "request_rate": rate})
                reports.append(_benchmark_one(one))
    finally:
        if proc is not None:
            stop(proc)
    if len(reports) == 1:
        rep = reports[0]
    else:
        rep = {"servers": reports}
        print(comparison(reports))
    if ns.save_result:
        name = ns.result_filename or f"bench-serve-{reports[0]['date']}.json"
        path = os.path.join(ns.result_dir, name)
        os.makedirs(ns.result_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(rep, f, indent=1)
        print(f"wrote {path}")
    return rep


def warm_up(ns) -> None:
    """``--warmup-prompts`` short requests, all at once, not measured."""
    model = ns.model or first_model(ns.base_url, ns.api_key)
    reqs = random_requests(ns.warmup_prompts, 16, 8, 0.0, ns.seed + 1)
    w = argparse.Namespace(**{**vars(ns), "request_rate": float("inf"), "disable_tqdm": True})
    asyncio.run(run(w, model, reqs))


def _requests(ns) -> list[BenchRequest]:
    if ns.dataset_name == "random":
        return random_requests(ns.num_prompts, ns.random_input_len, ns.random_output_len,
                               ns.random_range_ratio, ns.seed)
    if ns.dataset_name == "sharegpt-lengths":
        return sharegpt_length_requests(ns.num_prompts, ns.sharegpt_lengths_scale,
                                        ns.sharegpt_lengths_max_len, ns.seed)
    return sharegpt_requests(ns.dataset_path, ns.num_prompts, ns.seed, ns.sharegpt_output_len)


COMPARED = [("request_throughput", "req/s"), ("output_throughput", "out tok/s"),
            ("median_ttft_ms", "median TTFT ms"), ("median_tpot_ms", "median TPOT ms"),
            ("median_itl_ms", "median ITL ms"), ("median_e2el_ms", "median E2EL ms")]


def comparison(reports: list[dict]) -> str:
    """One line per server, the main figures side by side."""
    head = f"{'server':<28}" + "".join(f"{h:>16}" for _, h in COMPARED)
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(f"{str(r['label'])[:27]:<28}" +
                     "".join(f"{r[k]:>16.2f}" for k, _ in COMPARED))
    return "\n".join(lines)


def _benchmark_one(ns) -> dict:
    slos = parse_goodput(ns.goodput)
    percentiles = [float(p) for p in ns.metric_percentiles.split(",")]
    model = ns.model or first_model(ns.base_url, ns.api_key)
    reqs = _requests(ns)
    results, duration = asyncio.run(run(ns, model, reqs))
    rep = summarize(results, duration, percentiles, slos)
    rep.update(date=datetime.now().strftime("%Y%m%d-%H%M%S"), base_url=ns.base_url,
               endpoint=ns.endpoint, model=model, label=ns.label,
               num_prompts=ns.num_prompts, dataset=ns.dataset_name,
               request_rate=ns.request_rate if ns.request_rate != float("inf") else "inf",
               burstiness=ns.burstiness, max_concurrency=ns.max_concurrency, goodput_slos=slos,
               input_lens=[r.prompt_len for r in results], output_lens=[r.output_len
                                                                        for r in results],
               ttfts=[r.ttft for r in results], e2els=[r.e2el for r in results])
    metrics = [m for m in ns.percentile_metrics.split(",") if m]
    print(table(rep, metrics, percentiles, f"Serving Benchmark Result ({rep['label']})"))
    return rep


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="pagedjax bench serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(p)
    ns = p.parse_args(argv)
    try:
        benchmark(ns)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
