"""Serving throughput with 0 and with N dashboards open, in one run against one server.

    python benchmarks/serving/dashboard_overhead.py                 # starts a local server
    python benchmarks/serving/dashboard_overhead.py --rounds 3 --dashboards 3 --num-prompts 16

A "dashboard" is what the /dashboard page does on the server: it holds
``GET /dashboard/events`` open and reads one JSON event every 0.25 s (pool
snapshot + rolling points); these readers run in this process, so the browser's
own drawing cost is not charged to the server. Phases alternate (0, N, N, 0,
0, N, ...) so that a busy neighbour on a shared machine and any drift hit both
alike; each phase sends its own random prompts (no prefix-cache hits across phases),
``--num-prompts`` streamed completions at once (random token ids, ``ignore_eos``,
``--max-tokens`` each) and measures output tokens/s from the first request sent
to the last token received. Prints a table and writes JSON to
benchmarks/results/dashboard_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(ns) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "pagedjax.entrypoints.openai.api_server", "--port", str(port),
           "--max-model-len", str(ns.max_model_len), "--max-num-seqs", str(ns.max_num_seqs),
           "--log-level", "warning"]
    if ns.model:
        cmd += ["--model", ns.model]
    log = tempfile.NamedTemporaryFile("w+", prefix="dashboard-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + ns.startup_timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited; log: {log.name}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server not healthy in {ns.startup_timeout} s; log: {log.name}")


class Dashboard(threading.Thread):
    """Reads the event stream as the page does, until stopped; counts events and bytes."""

    def __init__(self, url: str, api_key: str | None):
        super().__init__(daemon=True)
        self.url, self.api_key = url, api_key
        self.stop = threading.Event()
        self.events = self.bytes = 0
        self.error = None
        self.build_ms: list[float] = []  # engine-thread CPU ms of each busy snapshot seen

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        req = urllib.request.Request(self.url + "/dashboard/events", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                for line in r:
                    if line.startswith(b"data: "):
                        ev = json.loads(line[6:])
                        snap = ev.get("snapshot")
                        if snap is not None and not snap["idle"]:
                            self.build_ms.append(snap["build_ms"])
                        self.events += 1
                        self.bytes += len(line)
                    if self.stop.is_set():
                        return
        except OSError as e:  # reported in the row: a reader that lost its stream
            self.error = f"{type(e).__name__}: {e}"


async def phase(url: str, api_key: str | None, model: str, ns, seed: int) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key=api_key or "none", max_retries=0,
                         timeout=600)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(100, 20000, ns.prompt_len).tolist() for _ in range(ns.num_prompts)]

    async def one(p):
        n = 0
        stream = await client.completions.create(
            model=model, prompt=p, max_tokens=ns.max_tokens, temperature=0.0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.usage is not None:
                n = chunk.usage.completion_tokens
        return n

    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(p) for p in prompts))
    dt = time.perf_counter() - t0
    await client.close()
    return {"tokens": int(sum(tokens)), "seconds": dt, "tokens_per_s": sum(tokens) / dt}


def run(ns) -> dict:
    proc, url = (None, ns.base_url) if ns.base_url else start_server(ns)
    try:
        with urllib.request.urlopen(urllib.request.Request(
                url + "/v1/models", headers={"Authorization": f"Bearer {ns.api_key}"}
                if ns.api_key else {}), timeout=30) as r:
            model = json.loads(r.read())["data"][0]["id"]
        asyncio.run(phase(url, ns.api_key, model, ns, seed=0))  # warm-up: compile the shapes
        rows = []
        for rnd in range(ns.rounds):
            order = (0, ns.dashboards) if rnd % 2 == 0 else (ns.dashboards, 0)
            for n_dash in order:
                boards = [Dashboard(url, ns.api_key) for _ in range(n_dash)]
                for b in boards:
                    b.start()
                time.sleep(1.0 if boards else 0.0)
                # Fresh prompts every phase: no prefix-cache hits from an earlier phase.
                seed = 1 + 2 * rnd + (n_dash > 0)
                res = asyncio.run(phase(url, ns.api_key, model, ns, seed=seed))
                for b in boards:
                    b.stop.set()
                res.update(round=rnd, dashboards=n_dash, events=sum(b.events for b in boards),
                           event_bytes=sum(b.bytes for b in boards),
                           reader_errors=[b.error for b in boards if b.error],
                           snapshot_build_ms=[x for b in boards for x in b.build_ms])
                rows.append(res)
                print(f"round {rnd} dashboards {n_dash}: {res['tokens_per_s']:.1f} tok/s",
                      flush=True)
                time.sleep(1.5)  # let the readers notice the stop and disconnect
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    return {"rows": rows, "summary": summarize(rows, ns.dashboards)}


def summarize(rows: list[dict], n: int) -> dict:
    base = [r["tokens_per_s"] for r in rows if r["dashboards"] == 0]
    with_ = [r["tokens_per_s"] for r in rows if r["dashboards"] == n]
    ev = [r for r in rows if r["dashboards"] == n]
    builds = [x for r in ev for x in r.get("snapshot_build_ms", [])]
    return {"median_tok_s_0": float(np.median(base)), f"median_tok_s_{n}": float(np.median(with_)),
            "ratio": float(np.median(with_) / np.median(base)),
            "per_round_ratios": [w / b for w, b in zip(with_, base)],
            "event_bytes_per_event": (sum(r["event_bytes"] for r in ev)
                                      / max(1, sum(r["events"] for r in ev))),
            "snapshot_build_ms_median": float(np.median(builds)) if builds else None,
            "snapshot_build_ms_max": max(builds) if builds else None}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="a running server; else one is started")
    p.add_argument("--api-key", default=os.environ.get("PAGEDJAX_API_KEY"))
    p.add_argument("--model", default=None)
    p.add_argument("--dashboards", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--output", default=os.path.join(os.path.dirname(HERE), "results", "dashboard_overhead.json"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    from pagedjax.benchmarks.machine import machine

    ns = parse_args(argv)
    out = run(ns)
    out.update(args=vars(ns), machine=machine())
    s, n = out["summary"], ns.dashboards
    print(f"\n| dashboards | median output tok/s ({ns.rounds} rounds) |\n|---|---|")
    print(f"| 0 | {s['median_tok_s_0']:.1f} |\n| {n} | {s[f'median_tok_s_{n}']:.1f} |")
    print(f"ratio {n} / 0: {s['ratio']:.3f} (per round: "
          f"{', '.join(f'{r:.3f}' for r in s['per_round_ratios'])}); "
          f"{s['event_bytes_per_event']:.0f} bytes per event; a busy snapshot took "
          f"{s['snapshot_build_ms_median']:.3f} ms (median) of engine-thread CPU time, "
          f"{s['snapshot_build_ms_max']:.3f} ms at most")
    os.makedirs(os.path.dirname(ns.output), exist_ok=True)
    with open(ns.output, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
