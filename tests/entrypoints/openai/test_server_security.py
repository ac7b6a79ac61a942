"""Bad input and request gating on the shared server (started with --api-key).

Each kind of client mistake that used to be a 500 is a 400 naming the field,
non-JSON bodies get 415, foreign Host headers 403, and with a key /metrics
and the docs need it while /health does not.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

OK_BODY = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}


def _ok(server):
    st, body = server.raw("POST", "/v1/completions", OK_BODY)
    assert st == 200, body


def _err(st, body, status, param="unset"):
    assert st == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    if param != "unset":
        assert body["error"]["param"] == param, body
    return body["error"]


@pytest.mark.parametrize("raw,param", [
    ('{"prompt": "abc \\ud800 def", "max_tokens": 1}', "prompt"),      # lone surrogate
    ('{"prompt": "x", "n": ' + "9" * 5000 + "}", None),               # over the digit limit
    ('{"prompt": "x", "n": ' + "9" * 4000 + "}", "n"),                # a huge int
    ('{"prompt": ' + "[" * 30000 + "]" * 30000 + "}", None),          # deep nesting
    ('{"prompt": ' + "[" * 40 + "1" + "]" * 40 + "}", "prompt"),      # nesting past our limit
    ('{"prompt": "x", "temperature": NaN}', None),                    # not JSON
    ('{"prompt": [1, true, 3]}', "prompt"),                           # a boolean as a token id
    ('{"prompt": "x", "n": "3"}', "n"),                               # a string as a number
    ('{"prompt": "x", "stream": "yes"}', "stream"),
    ('{"prompt": "x", "temperature": 3.5}', "temperature"),           # beyond the documented max
    ('{"prompt": "x", "stop_token_ids": [false]}', "stop_token_ids"),
])
def test_former_500s_are_400(server, raw, param):
    st, body = server.raw("POST", "/v1/completions", raw)
    e = _err(st, body, 400)
    if param is not None:
        assert e["param"] == param, e
    assert len(e["message"]) < 1200
    _ok(server)


def test_chat_schema_errors_name_the_field(server):
    for msgs, param in (([{"role": "", "content": "x"}], "messages"),
                        ([{"role": "user", "content": 5}], "messages"),
                        ([{"content": "x"}], "messages")):
        st, body = server.raw("POST", "/v1/chat/completions", {"messages": msgs})
        _err(st, body, 400, param)
    st, body = server.raw("POST", "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                           "top_logprobs": 50})
    assert "top_logprobs" in _err(st, body, 400, "top_logprobs")["message"]
    _ok(server)


def test_error_messages_quote_a_short_prefix(server):
    big = "A" * 30000  # the shared server's body limit is 64 KiB
    for body in ({"prompt": "x", "n": big}, {"prompt": "x", "model": big},
                 {"prompt": "x", "stop": [big]}):
        st, resp = server.raw("POST", "/v1/completions", body)
        assert st in (400, 404), resp
        assert len(json.dumps(resp)) < 4096
        assert "AAAA" * 20 not in resp["error"]["message"]


def test_non_json_content_type_415(server):
    body = json.dumps(OK_BODY)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        st, resp = server.raw("POST", "/v1/completions", body, headers={"Content-Type": ctype})
        assert _err(st, resp, 415)["code"] == "unsupported_media_type"
    st, resp = server.raw("POST", "/v1/completions", body,
                          headers={"Content-Type": "application/json; charset=utf-8"})
    assert st == 200, resp


def test_foreign_host_rejected(server):
    for host in ("evil.example.com", "evil.example.com:8000", "192.168.1.10"):
        st, body = server.raw("GET", "/health", auth=False, headers={"Host": host})
        assert _err(st, body, 403)["code"] == "host_not_allowed"
    for host in ("localhost", "127.0.0.1:1234", "[::1]:80", "foo.localhost"):
        assert server.raw("GET", "/health", auth=False, headers={"Host": host})[0] == 200


def test_key_gates_metrics_and_docs_not_health(server):
    for path in ("/metrics", "/docs", "/openapi.json", "/redoc", "/v1/models"):
        st, body = server.raw("GET", path, auth=False)
        assert _err(st, body, 401)["code"] == "invalid_api_key", path
        assert server.raw("GET", path)[0] == 200, path
    assert server.raw("GET", "/health", auth=False)[0] == 200


def test_cors_off_by_default(server):
    st, _ = server.raw("OPTIONS", "/v1/completions", auth=False,
                       headers={"Origin": "https://evil.example.com",
                                "Access-Control-Request-Method": "POST"})
    assert st in (401, 405)  # no CORS preflight answer without --allowed-origins


def test_openapi_declares_bodies_and_errors(server):
    st, doc = server.raw("GET", "/openapi.json")
    assert st == 200
    for path, model in (("/v1/completions", "CompletionRequest"),
                        ("/v1/chat/completions", "ChatCompletionRequest")):
        op = doc["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith(model) and model in doc["components"]["schemas"]
        assert {"200", "400", "401", "413", "415", "500", "503"} <= set(op["responses"])
    temp = doc["components"]["schemas"]["CompletionRequest"]["properties"]["temperature"]
    assert "2.0" in json.dumps(temp) or "2" in json.dumps(temp)
