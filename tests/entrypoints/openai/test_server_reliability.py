"""Untrusted grammars, slow and stalled clients, and errors that name the rule, against
one real server started with short client timeouts and a 4 MiB body limit."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from tests.utils.server import skip_without_model, start_server, stop_server

pytestmark = pytest.mark.slow

STALL_S = 4.0
HEADER_S = 2.0
BODY_S = 2.0


@pytest.fixture(scope="module")
def srv():
    skip_without_model()
    s = start_server(["--max-request-body-bytes", str(4 * 2**20),
                      "--stream-stall-timeout", str(STALL_S), "--timeout-headers", str(HEADER_S),
                      "--timeout-body", str(BODY_S), "--structured-outputs-compile-workers", "1"])
    try:
        yield s
    finally:
        stop_server(s)


def chained(n: int) -> str:
    return "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(n)) + f'r{n}: "b"\n'


def _ok(srv) -> None:
    st, body = srv.raw("POST", "/v1/completions",
                       {"model": srv.model, "prompt": "Hello", "max_tokens": 2})
    assert st == 200 and body["choices"][0]["finish_reason"] in ("stop", "length"), body


@pytest.mark.parametrize("n", [5000, 50000])
def test_chained_grammar_is_400_and_the_server_lives(srv, n):
    text = chained(n)
    st, body = srv.raw("POST", "/v1/chat/completions", {
        "model": srv.model, "messages": [{"role": "user", "content": "Say a"}], "max_tokens": 4,
        "structured_outputs": {"grammar": text}})
    assert st == 400, (len(text), st, body)
    assert body["error"]["param"] == "structured_outputs", body
    assert srv.proc.poll() is None
    _ok(srv)


def test_lexer_blowup_regex_is_400_before_work(srv):
    before = srv.metrics().get("pagedjax:prompt_tokens_total", 0)
    for field in ({"structured_outputs": {"regex": "(a{1000}){1000}"}},
                  {"guided_grammar": "start: /(a{1000}){1000}/"}):
        st, body = srv.raw("POST", "/v1/completions", {"model": srv.model, "prompt": "a",
                                                       "max_tokens": 8, **field})
        assert st == 400 and "lexer" in body["error"]["message"], body
        assert "\n" not in body["error"]["message"]
    assert srv.metrics().get("pagedjax:prompt_tokens_total", 0) == before  # no work started
    _ok(srv)


@pytest.mark.parametrize("body,param,words", [
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ""}, "stop", "at least 1"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 65}, "stop", "64"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}},
     "logit_bias", "token id"),
    ({"messages": [{"role": "user", "content": "x"}],
      "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "300"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}] * 129},
     "tools", "128"),
])
def test_errors_name_the_rule(srv, body, param, words):
    st, out = srv.raw("POST", "/v1/chat/completions", {"model": srv.model, **body})
    assert st == 400 and out["error"]["param"] == param, out
    msg = out["error"]["message"]
    assert words in msg, msg
    assert not re.search(r"invalid literal|could not convert|constrained-|\.str\b|\.list\[", msg)


def _unread_stream(srv, max_tokens: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = srv.url.split("//")[1].split(":")
    s.connect((host, int(port)))
    body = json.dumps({"model": srv.model, "prompt": "Tell me a long story.", "stream": True,
                       "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 20})
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {srv.api_key}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    return s


def _ends(s: socket.socket) -> bool:
    """Reading now reaches a reset or the end of the stream (not a timeout)."""
    s.settimeout(10)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    return True


def test_unread_streams_are_ended_and_health_answers(srv):
    socks = [_unread_stream(srv, 480) for _ in range(16)]
    worst, stop = [0.0], threading.Event()

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            st, _ = srv.raw("GET", "/health", auth=False, timeout=10)
            worst[0] = max(worst[0], time.monotonic() - t0)
            assert st == 200
            time.sleep(0.1)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    try:
        deadline = time.time() + 240
        while srv.log().count("read nothing for") < 16:
            assert time.time() < deadline, srv.log()[-3000:]
            time.sleep(0.5)
        m = srv.wait_idle(timeout=30)
        assert m["pagedjax:kv_pages_held"] == 0
        for s in socks:  # each client learns that its connection is gone
            assert _ends(s), "the server left an unread stream open"
    finally:
        stop.set()
        t.join(15)
        for s in socks:
            s.close()
    assert worst[0] < 1.0, worst
    _ok(srv)


def _connect(srv) -> socket.socket:
    host, port = srv.url.split("//")[1].split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_slow_headers_body_and_chunked_get_408(srv):
    t0 = time.monotonic()
    s = _connect(srv)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
    answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    assert HEADER_S - 0.5 < time.monotonic() - t0 < HEADER_S + 5
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            f"\r\nAuthorization: Bearer {srv.api_key}\r\n").encode()
    for rest in (b"Content-Length: 100\r\n\r\n{\"prompt\": ",  # body never complete
                 b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n"):  # chunks never end
        s = _connect(srv)
        s.sendall(head + rest)
        answer = _read_all(s)
        assert answer.startswith(b"HTTP/1.1 408") and b"body" in answer, answer[:200]
    s = _connect(srv)  # a connection that sends nothing is closed without an answer
    assert _read_all(s) == b""
    srv.wait_idle()
    _ok(srv)
