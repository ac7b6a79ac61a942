"""/v1/embeddings with the official ``openai`` client on a tiny random Qwen3: float and
base64 equal transformers' pooled hidden states (while chat requests run in the
same batch), dimensions, token-id input, and 400s."""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest

from tests.utils.qwen3_tiny import build_random_qwen3

openai = pytest.importorskip("openai")

TOL = 1e-4  # float32 on both sides, unit-norm vectors (absolute, per component)
TEXTS = ["the river is by the garden", "music in the city at night", "water"]


@pytest.fixture(scope="module")
def eserver(tmp_path_factory):
    from tests.utils.server import start_server, stop_server

    path = build_random_qwen3(str(tmp_path_factory.mktemp("qwen3_embed_server")), seed=2)
    srv = start_server(["--model", path, "--pooling-type", "mean"])
    srv.path = path
    try:
        yield srv
    finally:
        stop_server(srv)


def test_embeddings_match_transformers_mixed_with_chat(eserver):
    from tests.utils.qwen3_tiny import hf_embed

    client = eserver.client()
    chats = []

    def chat():
        r = client.chat.completions.create(model=eserver.model, max_tokens=24,
                                           messages=[{"role": "user", "content": "hi"}])
        chats.append(r.usage.completion_tokens)

    threads = [threading.Thread(target=chat) for _ in range(3)]
    for t in threads:
        t.start()
    r = client.embeddings.create(model=eserver.model, input=TEXTS)
    b64 = client.embeddings.create(model=eserver.model, input=TEXTS, encoding_format="base64")
    for t in threads:
        t.join()
    assert len(chats) == 3
    ref = hf_embed(eserver.path, TEXTS, "mean")
    for d, e, want in zip(r.data, b64.data, ref):
        assert np.abs(np.asarray(d.embedding) - want).max() < TOL
        # asked for explicitly, the client hands base64 over as it came
        got = np.frombuffer(base64.b64decode(e.embedding), "<f4")
        assert np.abs(got - want).max() < TOL
    assert r.usage.prompt_tokens > 0 and [d.index for d in r.data] == [0, 1, 2]
    small = client.embeddings.create(model=eserver.model, input=TEXTS[0], dimensions=8)
    assert np.abs(np.asarray(small.data[0].embedding) -
                  hf_embed(eserver.path, TEXTS[:1], "mean", dims=8)[0]).max() < TOL
    ids = client.embeddings.create(model=eserver.model, input=[5, 6, 7, 8])
    assert len(ids.data) == 1 and len(ids.data[0].embedding) == 64


def test_embeddings_bad_input(eserver):
    client = eserver.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=eserver.model, input="x", dimensions=100000)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=eserver.model, input="x " * 600)
    assert e.value.body["param"] == "input"
    status, body = eserver.raw("POST", "/v1/embeddings", {"input": []})
    assert status == 400 and body["error"]["param"] == "input"
    status, body = eserver.raw("POST", "/v1/embeddings", {"input": "x",
                                                          "encoding_format": "int8"})
    assert status == 400
