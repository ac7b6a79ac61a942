"""``pagedjax run-batch`` on a file of 32 lines, two of them malformed: every line gets
its output line in order, the malformed ones an error line, a request the server
refuses its 400 body, the rest their completions (a tiny scripted Qwen3, so the
answers are known)."""

from __future__ import annotations

import json

import pytest

from pagedjax.entrypoints.cli import main
from tests.utils.reasoning_model import ANSWER, THOUGHT, build_reasoning_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_reasoning_model(str(tmp_path_factory.mktemp("batch_model")))


def _lines() -> list[str]:
    lines = []
    for i in range(30):
        if i % 2:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                    "temperature": 0.0}
            url = "/v1/chat/completions"
        else:
            body = {"prompt": "hi", "max_tokens": 3, "temperature": 0.0}
            url = "/v1/completions"
        if i == 7:
            body["max_tokens"] = 10**6  # refused by the server: a 400 response
        lines.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url,
                                 "body": body}))
    lines.insert(5, '{"custom_id": "broken", "method": "POST", "url": ')  # not JSON
    lines.insert(20, json.dumps({"custom_id": "where", "url": "/v1/images", "body": {}}))
    return lines


def test_run_batch_32_lines_two_malformed(model_dir, tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = _lines()
    assert len(lines) == 32
    src.write_text("\n".join(lines) + "\n")
    rc = main(["run-batch", "-i", str(src), "-o", str(dst), "--model", model_dir,
               "--reasoning-parser", "qwen3", "--max-model-len", "128", "--num-pages", "64",
               "--max-num-seqs", "8"])
    assert rc == 0
    outs = [json.loads(x) for x in dst.read_text().splitlines()]
    assert len(outs) == 32
    assert outs[5]["response"] is None and outs[5]["error"]["code"] == "invalid_json"
    assert outs[20]["custom_id"] == "where" and outs[20]["error"]["code"] == "invalid_url"
    ok = [o for o in outs if o["error"] is None]
    assert [o["custom_id"] for o in ok] == [f"r{i}" for i in range(30)]  # input order
    for i, o in enumerate(ok):
        r = o["response"]
        assert o["id"].startswith("batch_req_") and r["request_id"]
        if i == 7:
            assert r["status_code"] == 400 and r["body"]["error"]["param"] == "max_tokens"
            continue
        assert r["status_code"] == 200
        if i % 2:
            msg = r["body"]["choices"][0]["message"]
            assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER)
        else:
            assert r["body"]["object"] == "text_completion"
            assert r["body"]["usage"]["completion_tokens"] == 3


def test_run_batch_embedding_score_and_rerank_lines(tmp_path_factory, tmp_path):
    """Embedding lines (text, texts, base64, Matryoshka), /v1/score and /rerank lines
    and a chat line in one file, on a tiny random Qwen3: the vectors equal
    transformers' pooled hidden states, the scores its yes/no scores."""
    import base64

    import numpy as np

    from tests.utils.qwen3_tiny import build_random_qwen3, hf_embed, hf_scores

    path = build_random_qwen3(str(tmp_path_factory.mktemp("batch_qwen3")), seed=1)
    texts = ["the river is by the garden", "music in the city", "water"]
    docs = ["the river is by the garden", "water"]
    reqs = [("e0", "/v1/embeddings", {"input": texts[0]}),
            ("e1", "/v1/embeddings", {"input": texts, "encoding_format": "base64"}),
            ("e2", "/v1/embeddings", {"input": texts[1], "dimensions": 16}),
            ("bad", "/v1/embeddings", {"input": "x", "dimensions": 10**6}),
            ("s", "/v1/score", {"text_1": "where is the river", "text_2": docs}),
            ("r", "/rerank", {"query": "where is the river", "documents": docs, "top_n": 1}),
            ("c", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 4, "temperature": 0.0})]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"custom_id": c, "method": "POST", "url": u, "body": b})
                           + "\n" for c, u, b in reqs))
    assert main(["run-batch", "-i", str(src), "-o", str(dst), "--model", path,
                 "--max-model-len", "512", "--num-pages", "160", "--max-num-seqs", "8"]) == 0
    outs = {o["custom_id"]: o for o in map(json.loads, dst.read_text().splitlines())}
    assert list(outs) == [c for c, _, _ in reqs]
    body = {c: o["response"]["body"] for c, o in outs.items()}
    assert all(o["error"] is None for o in outs.values())
    assert {c: o["response"]["status_code"] for c, o in outs.items()} == {
        c: 400 if c == "bad" else 200 for c, _, _ in reqs}
    assert body["bad"]["error"]["param"] == "dimensions"
    ref = hf_embed(path, texts, "last")
    tol = 1e-4  # float32 on both sides, unit-norm vectors
    assert body["e0"]["object"] == "list" and body["e0"]["data"][0]["object"] == "embedding"
    assert np.abs(np.asarray(body["e0"]["data"][0]["embedding"]) - ref[0]).max() < tol
    for d in body["e1"]["data"]:
        v = np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
        assert np.abs(v - ref[d["index"]]).max() < tol
    v16 = np.asarray(body["e2"]["data"][0]["embedding"])
    assert len(v16) == 16 and np.abs(v16 - hf_embed(path, texts[1:2], "last", 16)[0]).max() < tol
    want = hf_scores(path, [("where is the river", d) for d in docs])
    assert [d["score"] for d in body["s"]["data"]] == pytest.approx(want, abs=2e-4)
    (best,) = body["r"]["results"]
    assert best["index"] == int(np.argmax(want))
    assert best["relevance_score"] == pytest.approx(max(want), abs=2e-4)
    assert body["c"]["object"] == "chat.completion"
