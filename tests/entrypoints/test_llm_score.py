"""LLM.score (a decoder as a yes/no cross-encoder reranker, as Qwen3-Reranker) equals
transformers' softmax over the "no" / "yes" logits on a tiny random Qwen3; its
requests are prefill only (no sampler row)."""

from __future__ import annotations

import pytest

from pagedjax.entrypoints.scoring import YesNoScorer, pairs_of
from tests.utils.qwen3_tiny import build_random_qwen3, hf_scores

QUERY = "where is the river"
DOCS = ["the river is by the garden", "music in the city", "water", "the old house"]
TOL = 2e-4  # float32 on both sides; scores are in [0, 1]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_random_qwen3(str(tmp_path_factory.mktemp("qwen3_score")))


def test_score_matches_transformers(qwen3_dir, monkeypatch):
    from pagedjax import LLM

    llm = LLM(qwen3_dir, max_model_len=512, max_num_seqs=8, num_pages=160)
    runner = llm.llm_engine.core.runner
    sampled: list[str] = []
    launch = runner.launch

    def recording_launch(rows, *args, **kw):
        # the step's sampling rows: each row that samples, then the forks of n > 1 prompts
        sampled.extend(r.request_id for r in rows if r.num_samples)
        sampled.extend(rows[i].request_id for i, _ in kw.get("forks", ()))
        return launch(rows, *args, **kw)

    monkeypatch.setattr(runner, "launch", recording_launch)
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    assert sampled == []  # one prefill-only request per pair: no sampler row
    ref = hf_scores(qwen3_dir, pairs_of(QUERY, DOCS))
    got = [o.outputs.score for o in outs]
    assert got == pytest.approx(ref, abs=TOL)
    assert max(ref) - min(ref) > 0.05  # the scores tell the documents apart
    pairwise = llm.score([QUERY, "music"], ["water", "music in the city"], use_tqdm=False)
    assert [o.outputs.score for o in pairwise] == pytest.approx(
        hf_scores(qwen3_dir, [(QUERY, "water"), ("music", "music in the city")]), abs=TOL)


def test_pairs_and_tokens():
    assert pairs_of("q", ["a", "b"]) == [("q", "a"), ("q", "b")]
    with pytest.raises(ValueError, match="text_1"):
        pairs_of(["a", "b"], ["c"])

    class Tok:
        def encode(self, w, add_special_tokens=False):
            return [1, 2] if w == "yes" else [3]

    with pytest.raises(ValueError, match="'yes' to be one token"):
        YesNoScorer(Tok())
