"""LoRA adapters through the OpenAI server and the official openai client:
--lora-modules (both forms), /v1/models, the model field, 404 for unknown
names, vLLM's runtime load/unload endpoints, no KV page held afterwards."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
openai = pytest.importorskip("openai")

from tests.utils.lora import make_adapter, tiny_hf_model  # noqa: E402
from tests.utils.server import start_server, stop_server  # noqa: E402


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, smollm2_gguf):
    root = tmp_path_factory.mktemp("lora_server")
    base = tiny_hf_model("llama", vocab=49152, seed=5)
    base.save_pretrained(root / "base")
    for i in (1, 2):
        make_adapter(base, str(root / f"a{i}"), seed=200 + i, r=4, alpha=8)
    allowed = root / "allowed"
    allowed.mkdir()
    for i in (1, 2, 3):
        make_adapter(base, str(allowed / f"a{i}"), seed=200 + i, r=4, alpha=8)
    (allowed / "empty").mkdir()
    srv = start_server([
        "--model", str(root / "base"), "--tokenizer", smollm2_gguf, "--max-model-len", "128",
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
        "--allow-runtime-lora-updating", "--allowed-lora-paths", str(allowed),
        "--lora-modules", f"a1={root / 'a1'}",
        json.dumps({"name": "a2", "path": str(root / "a2"), "base_model_name": "tiny"})])
    try:
        yield srv, root
    finally:
        stop_server(srv)


def _complete(client, model, prompt="Hello there, my", **kw):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0.0, **kw)
    return r.choices[0].text


def test_models_list_and_routing(lora_server):
    srv, root = lora_server
    client = srv.client()
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {srv.model, "a1", "a2"}
    assert cards["a1"].parent == srv.model and cards["a1"].root == str(root / "a1")
    assert cards["a2"].parent == "tiny"
    base, a1, a2 = (_complete(client, m) for m in (srv.model, "a1", "a2"))
    assert len({base, a1, a2}) == 3, "each adapter changes the output"
    assert _complete(client, "a1") == a1
    chat = client.chat.completions.create(model="a2", max_tokens=4, temperature=0.0,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert chat.model == "a2" and chat.choices[0].message.content is not None

    async def mixed():  # base and both adapters at once: each as alone
        ac = srv.async_client()
        outs = await asyncio.gather(*[
            ac.completions.create(model=m, prompt="Hello there, my", max_tokens=8,
                                  temperature=0.0) for m in (srv.model, "a1", "a2", "a1")])
        return [o.choices[0].text for o in outs]

    assert asyncio.run(mixed()) == [base, a1, a2, a1]
    with pytest.raises(openai.NotFoundError) as e:
        _complete(client, "no-such-adapter")
    assert "does not exist" in str(e.value)
    srv.wait_idle()


def test_runtime_load_and_unload(lora_server):
    srv, root = lora_server
    root = root / "allowed"
    client = srv.client()
    st, body = srv.raw("POST", "/v1/load_lora_adapter",
                       {"lora_name": "a3", "lora_path": str(root / "a3")})
    assert st == 200 and "a3" in body
    assert "a3" in {m.id for m in client.models.list().data}
    out = _complete(client, "a3")  # a third adapter in two slots: one is evicted
    assert out == _complete(client, "a3")
    st, body = srv.raw("POST", "/v1/load_lora_adapter",
                       {"lora_name": "a3", "lora_path": str(root / "a3")})
    assert st == 400 and "already been loaded" in body["error"]["message"]
    st, body = srv.raw("POST", "/v1/load_lora_adapter",
                       {"lora_name": "x", "lora_path": str(root / "missing")})
    assert st == 404 and body["error"]["param"] == "lora_path"
    st, body = srv.raw("POST", "/v1/load_lora_adapter",
                       {"lora_name": "x", "lora_path": str(root / "empty")})
    assert st == 400 and "adapter_config.json is missing" in body["error"]["message"]
    st, body = srv.raw("POST", "/v1/load_lora_adapter", {"lora_path": str(root / "a3")})
    assert st == 400 and body["error"]["param"] == "lora_name"
    st, _ = srv.raw("POST", "/v1/unload_lora_adapter", {"lora_name": "a3"})
    assert st == 200
    assert "a3" not in {m.id for m in client.models.list().data}
    with pytest.raises(openai.NotFoundError):
        _complete(client, "a3")
    st, body = srv.raw("POST", "/v1/unload_lora_adapter", {"lora_name": "a3"})
    assert st == 404 and body["error"]["code"] == "not_found"
    srv.wait_idle()


def test_runtime_updates_off_by_default(server):
    """The shared server runs without --enable-lora: the routes answer 404, OpenAI-shaped."""
    st, body = server.raw("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"})
    assert st == 404 and "--allow-runtime-lora-updating" in body["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        server.client().completions.create(model="a", prompt="x", max_tokens=1)


def _bad_copy(src, dst, config) -> str:
    """A copy of adapter ``src`` whose adapter_config.json is ``config`` (raw JSON text)."""
    import shutil

    shutil.copytree(src, dst)
    (dst / "adapter_config.json").write_text(config)
    return str(dst)


def test_runtime_load_errors_are_4xx_json_and_do_not_reveal_paths(lora_server):
    srv, root = lora_server
    allowed = root / "allowed"
    cfg = json.loads((allowed / "a1" / "adapter_config.json").read_text())
    cases = {
        "list": _bad_copy(allowed / "a1", allowed / "cfg_list", "[1, 2]"),
        "rank0": _bad_copy(allowed / "a1", allowed / "cfg_rank0", json.dumps({**cfg, "r": 0})),
        "notjson": _bad_copy(allowed / "a1", allowed / "cfg_text", "{not json"),
    }
    expect = {"list": "must be a JSON object", "rank0": "positive integer",
              "notjson": "not readable JSON"}
    for what, path in cases.items():
        st, body = srv.raw("POST", "/v1/load_lora_adapter", {"lora_name": what, "lora_path": path})
        assert st == 400, (what, st, body)
        assert expect[what] in body["error"]["message"] and body["error"]["param"] == "lora_path"
    # Outside the allow-list (a real adapter, a device file, the parent folder through
    # a symbolic link) and missing paths: one answer, whatever exists.
    (allowed / "escape").symlink_to(root / "a1")
    answers = set()
    for path in (root / "a1", "/dev/null", "/etc", allowed / "escape", allowed / "missing",
                 "/no/such/folder", allowed / ".." / "a1"):
        st, body = srv.raw("POST", "/v1/load_lora_adapter",
                           {"lora_name": "p", "lora_path": str(path)})
        message = re.sub(r"path .* does not exist", "path <p> does not exist",
                         body["error"]["message"])
        answers.add((st, message, body["error"]["param"], body["error"]["code"]))
    assert len(answers) == 1 and next(iter(answers))[0] == 404, answers
    # The keep-alive connection survives the errors: one connection, several requests.
    import http.client

    conn = http.client.HTTPConnection(srv.url.split("//")[1])
    for path in (cases["list"], str(allowed / "a1")):
        conn.request("POST", "/v1/load_lora_adapter",
                     json.dumps({"lora_name": "ka", "lora_path": path}),
                     {"Content-Type": "application/json",
                      "Authorization": f"Bearer {srv.api_key}"})
        r = conn.getresponse()
        r.read()
        assert r.status in (200, 400)
    conn.close()
    assert srv.raw("POST", "/v1/unload_lora_adapter", {"lora_name": "ka"})[0] == 200
    assert srv.raw("GET", "/health", auth=False)[0] == 200
