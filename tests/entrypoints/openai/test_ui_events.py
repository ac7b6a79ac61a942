"""The dashboard's event route over real HTTP (uvicorn in a thread, a tiny random
Llama): every snapshot it streams equals the engine's own counts at that step
(pages used / free / cached from the pool's statistics, running and waiting from
the scheduler, page-table entries against the pool's reference total), and the
last one is all free. Plus the page routes: gated like /metrics, --disable-ui,
Host rule, strict Content-Security-Policy, bad ``interval`` -> 400."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from pagedjax import AsyncLLM, SamplingParams
from pagedjax.engine.live_stats import LiveStats, StatLoggers
from pagedjax.entrypoints.openai.app import AppConfig, build_app
from pagedjax.entrypoints.openai.gate import GateConfig

KEY = "ui-key"
ENGINE = dict(max_model_len=128, max_num_seqs=2, max_num_batched_tokens=64, num_pages=12,
              page_size=8, enable_prefix_caching=True)


class Recorder:
    """The engine's own counts after every engine-thread iteration, by step number."""

    def __init__(self):
        self.by_step: dict[int, list[dict]] = {}

    def on_step(self, engine, num_requests):
        st = engine.pool_stats()
        self.by_step.setdefault(engine.num_steps, []).append(dict(
            used=st.used, free=st.free, cached=st.cached, refs=st.total_refs,
            running=engine.scheduler.num_running, waiting=engine.scheduler.num_waiting,
            preemptions=engine.scheduler.num_preemptions))

    def on_finished(self, output, seqs=None):
        pass

    def on_error(self):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_llama_dir, smollm2_gguf):
    import uvicorn

    rec, live = Recorder(), LiveStats(interval=0.1)
    llm = AsyncLLM(tiny_llama_dir, tokenizer=smollm2_gguf,
                   stat_logger=StatLoggers(rec, live), **ENGINE)
    config = AppConfig(served_model_names=["tiny"], gate=GateConfig(api_key=KEY),
                       live_stats=live)
    port = _free_port()
    app = build_app(llm, config)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", llm, rec, app
    server.should_exit = True
    llm.shutdown()
    thread.join(10)


def _get(url, key=None, host=None):
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read(4096)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _read_events(url, out: list, stop: threading.Event):
    req = urllib.request.Request(url + "/dashboard/events?interval=0.1",
                                 headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            if line.startswith(b"data: "):
                out.append(json.loads(line[6:]))
            if stop.is_set():
                return


async def _run_requests(llm, n: int):
    params = SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.0)

    async def one(i):
        prompt = {"prompt_token_ids": [(7 * i + j) % 400 + 5 for j in range(20)]}
        return [o async for o in llm.generate(prompt, params, f"ev-{i}")]
    return await asyncio.gather(*(one(i) for i in range(n)))


def test_snapshots_match_the_engines_counts(served):
    url, llm, rec, _ = served
    events: list[dict] = []
    stop = threading.Event()
    reader = threading.Thread(target=_read_events, args=(url, events, stop), daemon=True)
    reader.start()
    while not events:
        time.sleep(0.05)
    # 48 requests, two at a time: ~700 steps, several 0.1 s snapshots even on a fast machine
    outs = asyncio.run(_run_requests(llm, 48))
    assert all(o[-1].finished for o in outs)
    deadline = time.time() + 30
    while not (events[-1].get("snapshot", {}).get("idle") or time.time() > deadline):
        time.sleep(0.05)
    time.sleep(0.3)
    stop.set()
    reader.join(10)
    snaps = [e["snapshot"] for e in events if "snapshot" in e]
    busy = [s for s in snaps if s["counts"]["running"]]
    assert len(busy) >= 3, "the stream showed too little of the run"
    assert any(s["counts"]["waiting"] for s in busy), "max_num_seqs=2 with 48 requests: some wait"
    for s in snaps:
        c = s["counts"]
        seen = rec.by_step.get(c["steps"])
        assert seen, f"no engine record for step {c['steps']}"
        mine = dict(used=c["used"], free=c["free"], cached=c["cached"],
                    refs=sum(len(r["pages"]) for r in s["requests"]), running=c["running"],
                    waiting=c["waiting"], preemptions=c["preemptions"])
        assert mine in seen, (mine, seen)
        assert len(s["grid"]) == c["total"] == ENGINE["num_pages"] - 1
        assert [r["state"] for r in s["requests"]].count("running") == c["running"]
        for r in s["requests"]:
            assert all(s["grid"][p - 1] in "up" for p in r["pages"])
    assert snaps[-1]["idle"] and snaps[-1]["counts"]["used"] == 0
    assert snaps[-1]["requests"] == [] and llm.engine.pool_stats().used == 0
    points = [p for e in events for p in e["points"]]
    assert any(p["tokens_per_s"] > 0 for p in points)
    assert any(p["ttft"] is not None for p in points)
    assert max(p["batch"] for p in points) == 2


def test_pages_and_event_gate(served):
    url, _, _, _ = served
    status, headers, body = _get(url + "/")
    assert status == 200 and b"<title>pagedjax chat</title>" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    assert _get(url + "/dashboard")[0] == 200
    assert _get(url + "/ui/markdown.js")[0] == 200
    assert _get(url + "/ui/..%2Fapp.py")[0] == 404
    status, _, body = _get(url + "/dashboard/events")
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    status, _, body = _get(url + "/dashboard/events?interval=0", key=KEY)
    assert status == 400 and json.loads(body)["error"]["param"] == "interval"
    assert _get(url + "/", host="evil.example:80")[0] == 200  # no Host list in this config


def test_disable_ui_and_open_metrics(served):
    from fastapi.testclient import TestClient

    _, llm, _, _ = served
    off = build_app(llm, AppConfig(served_model_names=["tiny"], gate=GateConfig(api_key=KEY)))
    with TestClient(off) as c:
        for path in ("/", "/dashboard", "/dashboard/events", "/ui/chat.js"):
            r = c.get(path, headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
    gated = build_app(llm, AppConfig(
        served_model_names=["tiny"], live_stats=LiveStats(),
        gate=GateConfig(api_key=KEY, allowed_hosts=frozenset(), open_metrics=True)))
    with TestClient(gated, base_url="http://evil.example") as c:
        assert c.get("/").status_code == 403  # Host rule on a loopback bind
    with TestClient(gated, base_url="http://localhost") as c:
        r = c.get("/dashboard/events?interval=abc")  # open like /metrics: no key needed
        assert r.status_code == 400


def test_event_stream_ends_when_the_server_drains(served):
    url, _, _, app = served
    events: list[dict] = []
    stop = threading.Event()
    reader = threading.Thread(target=_read_events, args=(url, events, stop), daemon=True)
    reader.start()
    while not events:
        time.sleep(0.05)
    state = app.state.server
    state.draining = True
    try:
        reader.join(5)
        assert not reader.is_alive(), "the event stream kept a draining server busy"
    finally:
        state.draining = False
    deadline = time.time() + 5  # the gate counts the request done just after its last byte
    while state.active and time.time() < deadline:
        time.sleep(0.05)
    assert state.active == 0
