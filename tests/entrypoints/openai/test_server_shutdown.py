"""Server reliability against dedicated server processes: a loop that keeps answering
while heavy requests are handled, SIGTERM with requests in flight, engine thread death.

One server (no key, default 4 MiB body limit, --shutdown-timeout 4) serves the
loop and big-input tests and is then stopped with SIGTERM mid-stream; a second
one (key from PAGEDJAX_API_KEY) has its engine thread killed through the
test-only hook.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import threading
import time

import pytest

from tests.utils.server import skip_without_model, start_server, stop_server

pytestmark = pytest.mark.slow

SHUTDOWN_TIMEOUT = 4.0


@pytest.fixture(scope="module")
def srv():
    skip_without_model()
    s = start_server(["--shutdown-timeout", str(SHUTDOWN_TIMEOUT),
                      "--max-request-body-bytes", str(4 * 2**20),
                      "--allowed-hosts", "myhost.example",
                      "--allowed-origins", "https://app.example"], api_key=None)
    yield s
    stop_server(s)


def _port(s) -> int:
    return int(s.url.rsplit(":", 1)[1])


def _post(conn: http.client.HTTPConnection, path: str, body: dict):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()


def _health_latencies(s, stop: threading.Event, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", _port(s), timeout=30)
    while not stop.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        out.append((time.perf_counter() - t0, r.status))
        time.sleep(0.02)
    conn.close()


def _with_health_probe(s, fn):
    stop, lat = threading.Event(), []
    t = threading.Thread(target=_health_latencies, args=(s, stop, lat))
    t.start()
    try:
        time.sleep(0.2)
        result = fn()
    finally:
        stop.set()
        t.join()
    return result, lat


def test_heavy_template_does_not_block_health(srv):
    tmpl = ("{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}"
            "{% endfor %}")
    t0 = time.perf_counter()
    (st, body), lat = _with_health_probe(srv, lambda: srv.raw(
        "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                          "chat_template": tmpl}))
    elapsed = time.perf_counter() - t0
    assert st == 400 and body["error"]["param"] == "chat_template", body
    assert "longer than" in body["error"]["message"] and elapsed < 10
    times = sorted(x for x, _ in lat)
    assert len(times) >= 5 and all(code == 200 for _, code in lat)
    print(f"/health during a heavy template: median {1000 * times[len(times) // 2]:.1f} ms, "
          f"max {1000 * times[-1]:.1f} ms over {len(times)} probes")
    assert times[len(times) // 2] < 0.1 and times[-1] < 0.5


def test_big_prompt_does_not_block_health(srv):
    prompt = "hello world " * 330000  # ~4 MB, under the default 4 MiB body limit
    (st, body), lat = _with_health_probe(srv, lambda: srv.raw(
        "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1}))
    assert st == 400 and "maximum context length" in body["error"]["message"], body
    times = sorted(x for x, _ in lat)
    print(f"/health during a 4 MB prompt: median {1000 * times[len(times) // 2]:.1f} ms, "
          f"max {1000 * times[-1]:.1f} ms over {len(times)} probes")
    assert times[len(times) // 2] < 0.1 and times[-1] < 0.5


def test_allowed_hosts_and_cors_flags(srv):
    assert srv.raw("GET", "/health", headers={"Host": "myhost.example:8000"})[0] == 200
    assert srv.raw("GET", "/health", headers={"Host": "other.example"})[0] == 403
    pre = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type"}
    conn = http.client.HTTPConnection("127.0.0.1", _port(srv), timeout=30)
    conn.request("OPTIONS", "/v1/completions", headers={"Origin": "https://app.example", **pre})
    r = conn.getresponse()
    r.read()
    assert r.status == 200 and r.getheader("access-control-allow-origin") == "https://app.example"
    conn.request("OPTIONS", "/v1/completions", headers={"Origin": "https://evil.example", **pre})
    r = conn.getresponse()
    r.read()
    assert r.getheader("access-control-allow-origin") is None
    conn.close()


def test_3mb_bad_value_small_answer(srv):
    raw = '{"prompt": "x", "n": "' + "9" * 3_000_000 + '"}'
    st, body = srv.raw("POST", "/v1/completions", raw)
    assert st == 400 and len(json.dumps(body)) < 4096 and body["error"]["param"] == "n", body


def _stream_reader(s, body: dict, out: dict, key: str) -> None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", _port(s), timeout=120)
        r = _post(conn, "/v1/completions", body)
        out[key] = {"status": r.status, "data": r.read().decode()}
    except Exception as e:  # noqa: BLE001
        out[key] = {"status": None, "data": f"{type(e).__name__}: {e}"}


def test_sigterm_drains_then_exits_0(srv):
    long = {"prompt": "Tell me a very long story", "max_tokens": 480, "ignore_eos": True,
            "temperature": 0}
    results: dict = {}
    threads = [threading.Thread(target=_stream_reader, args=(srv, {**long, "stream": True},
                                                             results, f"stream{i}"))
               for i in range(3)]
    threads.append(threading.Thread(target=_stream_reader, args=(srv, long, results, "plain")))
    threads.append(threading.Thread(target=_stream_reader, args=(
        srv, {"prompt": "Hi", "max_tokens": 8, "stream": True, "temperature": 0}, results,
        "short")))
    for t in threads:
        t.start()
    deadline = time.time() + 60
    while srv.metrics().get("pagedjax:num_requests_running", 0) < 4 and time.time() < deadline:
        time.sleep(0.1)
    keep = http.client.HTTPConnection("127.0.0.1", _port(srv), timeout=30)
    keep.request("GET", "/health")
    assert keep.getresponse().read() == b""  # a kept-alive connection, opened before the signal
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    keep.request("POST", "/v1/completions", json.dumps({"prompt": "x"}),
                 {"Content-Type": "application/json"})
    r = keep.getresponse()
    assert r.status == 503 and json.loads(r.read())["error"]["code"] == "service_unavailable"
    st, body = srv.raw("POST", "/v1/completions", {"prompt": "x"}, auth=False)
    assert st == 503, body
    for t in threads:
        t.join(60)
    rc = srv.proc.wait(60)
    log = srv.log()
    assert rc == 0, log[-3000:]
    assert results["short"]["status"] == 200 and results["short"]["data"].endswith(
        "data: [DONE]\n\n")
    assert '"finish_reason": "length"' in results["short"]["data"]
    for i in range(3):
        d = results[f"stream{i}"]
        assert d["status"] == 200, d
        events = re.findall(r"^data: (.*)$", d["data"], re.M)
        assert events[-1] == "[DONE]" and "shutting down" in events[-2], events[-3:]
        assert json.loads(events[-2])["error"]["code"] == "service_unavailable"
    assert results["plain"]["status"] == 503, results["plain"]
    assert re.search(r"stopped: 0 KV page\(s\) held, exit status 0", log), log[-3000:]


def test_engine_thread_death_exits_nonzero(smollm2_gguf):
    skip_without_model()
    s = start_server(env_extra={"PAGEDJAX_API_KEY": "env-key-456"}, api_key=None)
    try:
        assert "env-key-456" not in open(f"/proc/{s.proc.pid}/cmdline").read()
        assert s.raw("GET", "/v1/models", auth=False)[0] == 401
        st, body = s.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 50},
                         headers={"X-Pagedjax-Test-Fault": "thread"})
        assert st == 503 and "died" in body["error"]["message"], body
        assert s.raw("GET", "/health", auth=False)[0] == 503
        rc = s.proc.wait(60)
        assert rc == 1, s.log()[-3000:]
    finally:
        stop_server(s)
