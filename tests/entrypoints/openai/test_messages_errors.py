"""/v1/messages errors in Anthropic's shape before and after the engine (a tiny
random Llama behind a real uvicorn server): a missing or wrong key is a 401
``authentication_error`` that the official ``anthropic`` client raises as its
``AuthenticationError``; ``x-api-key`` (what that client sends) and a bearer token
both open it; a bad body is a 400 ``invalid_request_error``, an unknown model or
route a 404 ``not_found_error``; OpenAI's routes keep OpenAI's shape."""

from __future__ import annotations

import socket
import threading
import time

import pytest

anthropic = pytest.importorskip("anthropic")

from pagedjax import AsyncLLM  # noqa: E402
from pagedjax.entrypoints.openai.app import AppConfig, build_app  # noqa: E402
from pagedjax.entrypoints.openai.gate import GateConfig  # noqa: E402

KEY = "messages-key"
HELLO = [{"role": "user", "content": "Say hello."}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url(tiny_llama_dir, smollm2_gguf):
    import uvicorn

    llm = AsyncLLM(tiny_llama_dir, tokenizer=smollm2_gguf, max_model_len=128, max_num_seqs=2,
                   num_pages=16, page_size=16)
    app = build_app(llm, AppConfig(served_model_names=["tiny"], gate=GateConfig(api_key=KEY)))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    llm.shutdown()
    thread.join(10)


def _client(url, **kw):
    return anthropic.Anthropic(base_url=url, max_retries=0, timeout=120.0, **kw)


def _error_body(exc) -> dict:
    body = exc.value.body
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


@pytest.mark.parametrize("auth", [dict(api_key="wrong"), dict(auth_token="wrong"),
                                  dict(api_key=None, auth_token=None)])
def test_missing_or_wrong_key_is_an_authentication_error(url, auth):
    client = _client(url, **auth) if auth.get("api_key") or auth.get("auth_token") else \
        _client(url, api_key="placeholder", default_headers={"x-api-key": anthropic.Omit()})
    with pytest.raises(anthropic.AuthenticationError) as e:
        client.messages.create(model="tiny", max_tokens=2, messages=HELLO)
    assert e.value.status_code == 401
    err = _error_body(e)
    assert err["type"] == "authentication_error" and "x-api-key" in err["message"]


def test_x_api_key_and_bearer_both_open_it(url):
    for auth in (dict(api_key=KEY), dict(auth_token=KEY)):
        m = _client(url, **auth).messages.create(model="tiny", max_tokens=3, messages=HELLO,
                                                 extra_body={"temperature": 0.0})
        assert m.type == "message" and m.usage.output_tokens <= 3


def test_bad_body_and_unknown_model_or_route(url):
    import httpx

    client = _client(url, api_key=KEY)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=0, messages=HELLO)
    err = _error_body(e)
    assert err["type"] == "invalid_request_error" and "max_tokens" in err["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=2, messages=HELLO)
    assert _error_body(e)["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.count_tokens(model="tiny", messages=HELLO)  # a route not served
    assert _error_body(e)["type"] == "not_found_error"
    r = httpx.get(url + "/v1/messages", headers={"x-api-key": KEY})
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(url + "/v1/models")  # an OpenAI route: OpenAI's shape
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(url + "/v1/models", headers={"x-api-key": KEY})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"
