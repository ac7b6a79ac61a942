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
