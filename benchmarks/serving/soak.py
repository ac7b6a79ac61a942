"""Soak test of the OpenAI server: many streaming clients, mixed requests, disconnects.

    python benchmarks/serving/soak.py                                   # 128 clients, 10 minutes
    python benchmarks/serving/soak.py --duration 30                     # the suite's short version
    python benchmarks/serving/soak.py --base-url http://127.0.0.1:8000 --server-pid PID --api-key KEY

Without --base-url it starts its own server on loopback (small engine settings
for CPU). Each client loops until the time or the request budget is spent:
completions or chat, mostly streamed, with mixed temperature / top_p / seed /
n / logprobs / stop strings; 15% of requests walk away mid-stream (or time out
early when not streamed). A request is *failed* if it gets a non-200 answer
or an exception, or a completed stream lacks a finish reason or [DONE]; *hung*
if it exceeds --request-timeout. Reports p50/p99 TTFT and end-to-end latency,
KV pages held once the server is idle, and the server's RSS over time (after
warm-up = the first sample past 10% of the run, mid = at half time). Prints a
table and writes JSON (default benchmarks/results/soak.json). ``--hostile N``
adds N clients of slow readers and bad input (benchmarks/serving/soak_hostile.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request

from pagedjax.benchmarks.machine import loadavg, machine  # noqa: E402

PROMPTS = ["Tell me about the sea.", "Write a short poem about autumn.", "def quicksort(xs):",
           "The three laws of motion are", "Summarize: the cat sat on the mat.",
           "List five fruits:", "Translate to French: good morning", "Once upon a time,"]


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
        return int(m.group(1)) / 1024 if m else None
    except OSError:
        return None


def get(url: str, api_key: str | None, timeout: float = 10.0) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"}
                                 if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def server_metrics(base: str, api_key: str | None) -> dict[str, float]:
    out = {}
    for line in get(f"{base}/metrics", api_key)[1].splitlines():
        m = re.match(r"^(pagedjax:[a-z0-9_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = float(m.group(3))
    return out


def make_request(rng: random.Random) -> dict:
    chat = rng.random() < 0.5
    kw = {"max_tokens": rng.randint(4, 32), "temperature": rng.choice([0.0, 0.7, 1.0]),
          "stream": rng.random() < 0.9}
    if rng.random() < 0.3:
        kw["top_p"] = 0.9
    if rng.random() < 0.5:
        kw["seed"] = rng.randint(0, 10**6)
    if rng.random() < 0.1:
        kw["n"] = 2
    if rng.random() < 0.1:
        kw["stop"] = [rng.choice([".", "\n", " the"])]
    if rng.random() < 0.1:
        kw.update({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2})
    if kw["stream"] and rng.random() < 0.3:
        kw["stream_options"] = {"include_usage": True}
    prompt = rng.choice(PROMPTS)
    if chat:
        kw["messages"] = [{"role": "user", "content": prompt}]
    else:
        kw["prompt"] = prompt
    return {"chat": chat, "kw": kw, "disconnect": rng.random() < 0.15}


async def one(client, model: str, spec: dict, timeout: float) -> dict:
    kw, chat = spec["kw"], spec["chat"]
    api = client.chat.completions if chat else client.completions
    t0 = time.perf_counter()
    rec = {"ttft": None, "e2e": None, "outcome": "ok", "error": None}
    try:
        async with asyncio.timeout(timeout):
            if not kw["stream"]:
                c = client.with_options(timeout=0.3) if spec["disconnect"] else client
                api = c.chat.completions if chat else c.completions
                try:
                    r = await api.create(model=model, **kw)
                except Exception:  # noqa: BLE001
                    if spec["disconnect"]:
                        rec["outcome"] = "disconnected"
                        return rec
                    raise
                assert all(ch.finish_reason for ch in r.choices), r
            else:
                stream = await api.create(model=model, **kw)
                chunks, finished = 0, set()
                async for chunk in stream:
                    chunks += 1
                    if rec["ttft"] is None and chunk.choices:
                        rec["ttft"] = time.perf_counter() - t0
                    finished.update(ch.index for ch in chunk.choices if ch.finish_reason)
                    if spec["disconnect"] and chunks == 2:
                        await stream.close()
                        rec["outcome"] = "disconnected"
                        return rec
                assert len(finished) == kw.get("n", 1), f"finish reasons for {finished}"
    except TimeoutError:
        rec["outcome"], rec["error"] = "hung", f"no answer in {timeout} s"
        return rec
    except Exception as e:  # noqa: BLE001 - recorded, never raised
        rec["outcome"], rec["error"] = "failed", f"{type(e).__name__}: {str(e)[:300]}"
        return rec
    rec["e2e"] = time.perf_counter() - t0
    return rec


async def run_clients(base: str, api_key: str | None, clients: int, duration: float,
                      max_requests: int, timeout: float, seed: int) -> list[dict]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base}/v1", api_key=api_key or "EMPTY", max_retries=0,
                         timeout=timeout)
    model = (await client.models.list()).data[0].id
    records: list[dict] = []
    t_end = time.time() + duration

    async def loop(i: int):
        rng = random.Random(seed * 1000 + i)
        while time.time() < t_end and len(records) < max_requests:
            records.append(await one(client, model, make_request(rng), timeout))

    await asyncio.gather(*(loop(i) for i in range(clients)))
    await client.close()
    return records


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return None if not xs else xs[min(len(xs) - 1, int(q * len(xs)))]


def sample_rss(pid: int, stop: threading.Event, out: list, t0: float, base: str,
               api_key: str | None) -> None:
    """(seconds, RSS MiB, XLA compilations so far) every 2 s."""
    while not stop.wait(2.0):
        try:
            comp = server_metrics(base, api_key).get("pagedjax:xla_compilations")
        except OSError:
            comp = None
        out.append((time.time() - t0, rss_mib(pid), comp))


def wait_idle(base: str, api_key: str | None, timeout: float = 120.0) -> dict:
    deadline = time.time() + timeout
    while True:
        m = server_metrics(base, api_key)
        busy = [m.get(k, 0) for k in ("pagedjax:num_requests_running",
                                      "pagedjax:num_requests_waiting",
                                      "pagedjax:num_requests_in_flight")]
        if not any(busy) or time.time() > deadline:
            return m
        time.sleep(0.5)


async def _all_clients(base, api_key, clients, duration, max_requests, timeout, seed, hostile):
    from soak_hostile import hostile_clients

    jobs = [run_clients(base, api_key, clients, duration, max_requests, timeout, seed)]
    if hostile:
        jobs.append(hostile_clients(base, api_key, hostile, time.time() + duration, timeout,
                                    seed))
    out = await asyncio.gather(*jobs)
    return out[0], (out[1] if hostile else [])


def soak(base: str, pid: int, api_key: str | None, clients: int, duration: float,
         max_requests: int, timeout: float = 120.0, seed: int = 0, hostile: int = 0) -> dict:
    """Run the soak against a running server; returns the summary dict."""
    rss: list = []
    stop, t0 = threading.Event(), time.time()
    rss.append((0.0, rss_mib(pid), server_metrics(base, api_key).get("pagedjax:xla_compilations")))
    sampler = threading.Thread(target=sample_rss, args=(pid, stop, rss, t0, base, api_key),
                               daemon=True)
    sampler.start()
    load0 = loadavg()
    records, bad = asyncio.run(_all_clients(base, api_key, clients, duration, max_requests,
                                            timeout, seed, hostile))
    stop.set()
    sampler.join()
    wall = time.time() - t0
    m = wait_idle(base, api_key)
    rss.append((time.time() - t0, rss_mib(pid), m.get("pagedjax:xla_compilations")))

    def at(frac: float, i: int = 1):
        return next((r[i] for r in rss if r[0] >= frac * duration and r[i] is not None),
                    rss[-1][i])

    by = {k: [r for r in records if r["outcome"] == k]
          for k in ("ok", "disconnected", "failed", "hung")}
    ok = by["ok"]
    rss_warm, rss_mid, rss_end = at(0.1), at(0.5), rss[-1][1]
    return {
        "clients": clients, "duration_s": duration, "wall_s": round(wall, 1),
        "started": len(records), "completed": len(ok), "disconnected": len(by["disconnected"]),
        "failed": len(by["failed"]), "hung": len(by["hung"]),
        "errors": [r["error"] for r in by["failed"] + by["hung"]][:20],
        "ttft_p50_ms": _ms(_pct([r["ttft"] for r in ok], 0.5)),
        "ttft_p99_ms": _ms(_pct([r["ttft"] for r in ok], 0.99)),
        "e2e_p50_ms": _ms(_pct([r["e2e"] for r in ok], 0.5)),
        "e2e_p99_ms": _ms(_pct([r["e2e"] for r in ok], 0.99)),
        "pages_held_at_end": m.get("pagedjax:kv_pages_held"),
        "rss_mib": {"start": rss[0][1], "after_warmup": rss_warm, "mid": rss_mid,
                    "end": rss_end},
        "rss_growth_second_half_pct": None if not rss_mid else
        round(100 * (rss_end - rss_mid) / rss_mid, 2),
        "xla_compilations": {"start": rss[0][2], "after_warmup": at(0.1, 2), "mid": at(0.5, 2),
                             "end": rss[-1][2]},
        "rss_timeline": [(round(t, 1), r, c) for t, r, c in rss],
        "hostile": _hostile_summary(bad),
        "loadavg_before": load0, "loadavg_after": loadavg(),
    }


def _hostile_summary(records: list[dict]) -> dict:
    from soak_hostile import summary

    return summary(records)


def _ms(x):
    return None if x is None else round(1000 * x, 1)


def start_server(ns) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "pagedjax.entrypoints.openai.api_server", "--port", str(port),
           "--max-model-len", "512", "--max-num-seqs", str(ns.max_num_seqs),
           "--num-pages", "512", "--log-level", "warning",
           "--stream-stall-timeout", str(ns.stall_timeout)] + (["--warmup"] if ns.warmup else [])
    proc = subprocess.Popen(cmd)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if get(f"{base}/health", None, 2)[0] == 200:
                return proc, base
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not become healthy in time")


def print_table(s: dict) -> None:
    rows = [("clients x duration", f"{s['clients']} x {s['duration_s']:.0f} s"),
            ("started / completed", f"{s['started']} / {s['completed']}"),
            ("disconnected on purpose", s["disconnected"]),
            ("failed / hung", f"{s['failed']} / {s['hung']}"),
            ("TTFT p50 / p99 ms", f"{s['ttft_p50_ms']} / {s['ttft_p99_ms']}"),
            ("end-to-end p50 / p99 ms", f"{s['e2e_p50_ms']} / {s['e2e_p99_ms']}"),
            ("KV pages held at end", s["pages_held_at_end"]),
            ("RSS MiB warm / mid / end", "{after_warmup} / {mid} / {end}".format(
                **{k: f"{v:.0f}" if v else "-" for k, v in s["rss_mib"].items()})),
            ("RSS growth, second half", f"{s['rss_growth_second_half_pct']} %"),
            ("XLA compiles warm/mid/end", "{after_warmup} / {mid} / {end}".format(
                **s["xla_compilations"]))]
    for k, v in rows:
        print(f"{k:<26} {v}")
    for kind, d in s.get("hostile", {}).items():
        print(f"{'hostile ' + kind:<26} ok {d['ok']} / failed {d['failed']} / hung {d['hung']}")
    for e in s["errors"][:5]:
        print("  error:", e)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=128)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="a request with no answer by then counts as hung (queueing behind 128 "
                        "clients on 2 CPU cores takes minutes, which is not a hang)")
    p.add_argument("--base-url", default=None)
    p.add_argument("--server-pid", type=int, default=None)
    p.add_argument("--api-key", default=os.environ.get("PAGEDJAX_API_KEY"))
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", action="store_true",
                   help="start the server with --warmup (every step shape compiled first)")
    p.add_argument("--hostile", type=int, default=0,
                   help="extra clients of slow readers and bad input (soak_hostile.py)")
    p.add_argument("--stall-timeout", type=float, default=10.0,
                   help="--stream-stall-timeout of the server this script starts")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                 "results", "soak.json"))
    ns = p.parse_args(argv)
    proc = None
    if ns.base_url is None:
        proc, base = start_server(ns)
        pid = proc.pid
    else:
        base, pid = ns.base_url.rstrip("/"), ns.server_pid
        if pid is None:
            p.error("--server-pid is needed with --base-url (for the RSS figures)")
    try:
        summary = soak(base, pid, ns.api_key, ns.clients, ns.duration, ns.max_requests,
                       ns.request_timeout, ns.seed, ns.hostile)
    finally:
        if proc is not None:
            proc.terminate()
            summary_rc = proc.wait(120)
    if proc is not None:
        summary["server_exit_status"] = summary_rc
    summary["machine"] = machine()
    summary["command"] = " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))
    print_table(summary)
    os.makedirs(os.path.dirname(ns.out), exist_ok=True)
    with open(ns.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {ns.out}")
    bad = summary["failed"] or summary["hung"] or summary["pages_held_at_end"] or any(
        d["failed"] or d["hung"] for d in summary["hostile"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
