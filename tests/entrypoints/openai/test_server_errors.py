"""OpenAI server errors: each is OpenAI-shaped and is followed by a request that succeeds."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.utils.server import SERVER_ARGS

pytestmark = pytest.mark.slow

OK_BODY = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}


def _ok(server):
    st, body = server.raw("POST", "/v1/completions", OK_BODY)
    assert st == 200, body
    assert body["usage"]["completion_tokens"] == 2


def _err(body, status, st, type_="invalid_request_error"):
    assert st == status, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert e["type"] == type_ and e["message"]
    return e


@pytest.mark.parametrize("raw,param", [
    ('{"prompt": "x", ', None),                       # malformed JSON
    ('[1, 2]', None),                                 # not an object
    ('{"max_tokens": 3}', "prompt"),                  # missing field
    ('{"prompt": "x", "n": "many"}', "n"),            # pydantic type error
    ('{"prompt": "x", "temperature": -1}', "temperature"),   # SamplingParams ValueError
    ('{"prompt": "x", "top_p": 0}', "top_p"),
    ('{"prompt": "x", "logprobs": 50}', "logprobs"),
    ('{"prompt": "x", "logit_bias": {"999999": 1}}', "logit_bias"),
    ('{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ('{"prompt": [99999999]}', "prompt"),
    ('{"prompt": ""}', "prompt"),
])
def test_bad_requests_400(server, raw, param):
    st, body = server.raw("POST", "/v1/completions", raw)
    e = _err(body, 400, st)
    if param:
        assert e["param"] == param, e
    _ok(server)


def test_bad_chat_400(server):
    st, body = server.raw("POST", "/v1/chat/completions", {"messages": []})
    _err(body, 400, st)
    st, body = server.raw("POST", "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    _err(body, 400, st)
    _ok(server)


def test_openai_client_errors(server):
    import openai

    c = server.client()
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(model=server.model, prompt="x", temperature=-3)
    assert "temperature" in ei.value.message
    with pytest.raises(openai.NotFoundError) as ei:
        c.completions.create(model="no-such-model", prompt="x")
    assert ei.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    _ok(server)


def test_wrong_or_missing_key_401(server):
    import openai

    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
        st, body = server.raw("POST", "/v1/completions", OK_BODY, headers=headers, auth=False)
        assert _err(body, 401, st)["code"] == "invalid_api_key"
    st, body = server.raw("GET", "/v1/models", auth=False)
    _err(body, 401, st)
    bad = server.client()
    bad.api_key = "nope"
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=server.model, prompt="x", max_tokens=1)
    assert server.raw("GET", "/health", auth=False)[0] == 200  # health needs no key
    _ok(server)


def test_prompt_too_long_400(server):
    limit = SERVER_ARGS["max_model_len"]
    st, body = server.raw("POST", "/v1/completions",
                          {"prompt": "x", "max_tokens": limit + 10})
    e = _err(body, 400, st)
    assert str(limit) in e["message"] and "maximum context length" in e["message"]
    st, body = server.raw("POST", "/v1/completions", {"prompt": [5] * (limit + 1),
                                                      "max_tokens": 1})
    assert str(limit) in _err(body, 400, st)["message"]
    st, body = server.raw("POST", "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi " * 600}]})
    assert str(limit) in _err(body, 400, st)["message"]
    _ok(server)


def test_body_too_large_413(server):
    st, body = server.raw("POST", "/v1/completions",
                          {"prompt": "x" * 70000, "max_tokens": 1})
    assert _err(body, 413, st)["code"] == "request_too_large"
    _ok(server)


def test_engine_exception_fails_only_that_request(server):
    st, body = server.raw("POST", "/v1/completions", OK_BODY,
                          headers={"X-Pagedjax-Test-Fault": "step"})
    _err(body, 500, st, type_="server_error")
    assert "injected" in body["error"]["message"]
    assert server.raw("GET", "/health", auth=False)[0] == 200
    _ok(server)
    assert server.metrics()["pagedjax:engine_errors_total"] >= 1
    server.wait_idle()


def test_client_disconnect_mid_stream_frees_pages(server):
    # A streaming client that reads a few chunks and drops the connection.
    body = json.dumps({"prompt": "Tell me a long story about a dragon", "max_tokens": 400,
                       "ignore_eos": True, "stream": True, "temperature": 0}).encode()
    port = int(server.url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {server.api_key}\r\nContent-Length: {len(body)}\r\n\r\n"
              .encode() + body)
    got = b""
    deadline = time.time() + 120
    while got.count(b"data: ") < 4 and time.time() < deadline:
        got += s.recv(65536)
    assert b"200 OK" in got and got.count(b"data: ") >= 4
    m = server.metrics()
    assert m["pagedjax:kv_pages_held"] > 0  # the request is running and holds pages
    s.close()
    m = server.wait_idle(timeout=30)
    assert m["pagedjax:kv_pages_held"] == 0
    # A non-streaming client that disconnects while waiting is aborted too.
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "Count to a thousand", "max_tokens": 400, "ignore_eos": True,
                       "temperature": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {server.api_key}\r\nContent-Length: {len(body)}\r\n\r\n"
              .encode() + body)
    deadline = time.time() + 60
    while server.metrics()["pagedjax:kv_pages_held"] == 0 and time.time() < deadline:
        time.sleep(0.2)
    s.close()
    server.wait_idle(timeout=30)
    _ok(server)
