"""LLM.score (a decoder as a yes/no cross-encoder reranker, as Qwen3-Reranker) equals
transformers' softmax over the "no" / "yes" logits on a tiny random Qwen3."""

from __future__ import annotations

import pytest

from pagedjax.entrypoints.scoring import YesNoScorer, pairs_of, rerank_prompt
from tests.utils.qwen3_tiny import build_random_qwen3

QUERY = "where is the river"
DOCS = ["the river is by the garden", "music in the city", "water", "the old house"]
TOL = 2e-4  # float32 on both sides; scores are in [0, 1]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_random_qwen3(str(tmp_path_factory.mktemp("qwen3_score")))


def hf_scores(path: str, pairs) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    out = []
    with torch.no_grad():
        for q, d in pairs:
            ids = tok(rerank_prompt(q, d), return_tensors="pt", add_special_tokens=False)
            logits = model(**ids).logits[0, -1]
            out.append(torch.softmax(logits[[no, yes]], -1)[1].item())
    return out


def test_score_matches_transformers(qwen3_dir):
    from pagedjax import LLM

    llm = LLM(qwen3_dir, max_model_len=512, max_num_seqs=8, num_pages=160)
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
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
