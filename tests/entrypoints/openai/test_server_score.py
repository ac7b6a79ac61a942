"""/score and /rerank (vLLM's shapes, also under /v1) with the default model as a yes/no
reranker: scores in [0, 1], the two routes agree, rerank orders and cuts, and bad
input answers 400. (Equality with transformers: tests/entrypoints/test_llm_score.py.)"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "France is in Europe."]


def test_score_and_rerank_agree(server):
    st, body = server.raw("POST", "/score", {"text_1": QUERY, "text_2": DOCS})
    assert st == 200, body
    scores = [d["score"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(0.0 <= s <= 1.0 for s in scores) and body["usage"]["prompt_tokens"] > 0
    st, rr = server.raw("POST", "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    assert st == 200, rr
    res = rr["results"]
    order = sorted(range(3), key=lambda i: -scores[i])[:2]
    assert [r["index"] for r in res] == order
    assert [r["relevance_score"] for r in res] == pytest.approx([scores[i] for i in order],
                                                                 abs=1e-5)
    assert res[0]["document"]["text"] == DOCS[order[0]]
    st, pair = server.raw("POST", "/v1/score", {"text_1": [QUERY, QUERY],
                                                "text_2": [DOCS[1], DOCS[0]]})
    assert [d["score"] for d in pair["data"]] == pytest.approx([scores[1], scores[0]], abs=1e-5)


def test_score_bad_input(server):
    st, body = server.raw("POST", "/score", {"text_1": ["a", "b"], "text_2": ["c"]})
    assert st == 400 and body["error"]["param"] == "text_2"
    st, body = server.raw("POST", "/rerank", {"query": "q", "documents": []})
    assert st == 400 and body["error"]["param"] == "documents"
    st, body = server.raw("POST", "/rerank", {"query": "q", "documents": ["d"]}, auth=False)
    assert st == 401
    st, body = server.raw("POST", "/score", {"text_1": "q", "text_2": "d", "model": "nope"})
    assert st == 404
