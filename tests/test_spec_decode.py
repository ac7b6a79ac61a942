"""Speculative decoding: n-gram and draft-model proposals, rejection sampling.

Tiny random Llama models (HF folders): greedy outputs must equal plain decoding
token for token under preemption (a tiny page pool) and chunked prefill (a
small token budget), with no page left held; rejection sampling must keep the
target's distribution (chi-square against exact probabilities).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedjax import LLM, SamplingParams  # noqa: E402
from pagedjax.spec_decode.config import parse_speculative_config  # noqa: E402
from pagedjax.spec_decode.ngram import NgramProposer  # noqa: E402

VOCAB = 96


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from tests.spec_models import make_tiny_llama

    root = tmp_path_factory.mktemp("spec")
    return {"target": make_tiny_llama(str(root / "target"), VOCAB, 2, seed=0),
            "draft": make_tiny_llama(str(root / "draft"), VOCAB, 1, seed=5),
            "small_vocab": make_tiny_llama(str(root / "v64"), 64, 1, seed=1)}


# ---------------------------------------------------------------------------- config
@pytest.mark.parametrize("value, match", [
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
    ({"num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,
      "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "unknown key"),
    ({"model": "x", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "ngram. only"),
    ("{not json", "JSON"),
    (3, "dict"),
])
def test_bad_configs_are_clear_errors(value, match):
    with pytest.raises(ValueError, match=match):
        parse_speculative_config(value)


def test_config_forms():
    c = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max) == ("ngram", 3, 4)
    c = parse_speculative_config({"model": "/m", "num_speculative_tokens": 2})
    assert (c.method, c.model) == ("draft_model", "/m")


def test_draft_vocab_mismatch_is_clear(folders):
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(folders["target"], num_pages=16, max_model_len=64, speculative_config={
            "model": folders["small_vocab"], "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="could not be loaded"):
        LLM(folders["target"], num_pages=16, max_model_len=64, speculative_config={
            "model": "/nonexistent/draft", "num_speculative_tokens": 2})


def test_ngram_proposer():
    p = NgramProposer(3, prompt_lookup_max=3, prompt_lookup_min=1)
    assert p.propose([5, 6, 7, 8, 9, 5, 6, 7]) == [8, 9, 5]  # longest suffix [5, 6, 7]
    assert p.propose([1, 2, 3, 4, 1, 2, 9, 2]) == [9, 2]  # [9, 2] unseen -> [2], latest match
    assert p.propose([1, 2, 3]) == []
    assert p.propose([4, 4], k=5) == [4]
    assert p.propose([1, 2, 1], k=0) == []


# ---------------------------------------------------------------------------- engine
PROMPTS = [[1] + [(7 * i + j) % 90 + 3 for j in range(n)]
           for i, n in enumerate([5, 40, 12, 70, 3, 25, 9])]


def _params():
    return [SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
            SamplingParams(temperature=0.0, max_tokens=24, logprobs=3),
            SamplingParams(temperature=0.0, max_tokens=17, stop=["w6 w85"]),
            SamplingParams(temperature=0.0, max_tokens=26, n=2, ignore_eos=True),
            SamplingParams(temperature=0.0, max_tokens=1),
            SamplingParams(temperature=0.0, max_tokens=40),  # may stop on EOS (w2)
            SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3)]


def _run(model, spec, **kw):
    # 13 pages of 8 tokens for up to 4 sequences of up to 110 tokens: preemption;
    # a 16-token budget: chunked prefill.
    llm = LLM(model, max_model_len=128, num_pages=13, page_size=8, max_num_seqs=4,
              max_num_batched_tokens=16, speculative_config=spec, **kw)
    engine = llm.llm_engine
    for i, (p, sp) in enumerate(zip(PROMPTS, _params())):
        engine.add_request(str(i), p, sp)
    done, preempted = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        preempted = max(preempted, sum(r.num_preemptions
                                       for r in engine.scheduler.requests.values()))
    return done, engine, preempted


def _summary(done):
    return {rid: [(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in out.outputs]
            for rid, out in done.items()}


@pytest.fixture(scope="module")
def plain(folders):
    done, engine, preempted = _run(folders["target"], None)
    assert preempted > 0 and engine.pool_stats().used == 0
    return done


@pytest.mark.parametrize("kind", ["ngram", "draft", "draft_is_target"])
def test_greedy_identical_with_speculation(folders, plain, kind):
    spec = {"ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
            "draft": {"model": folders["draft"], "num_speculative_tokens": 3},
            "draft_is_target": {"model": folders["target"], "num_speculative_tokens": 4}}[kind]
    done, engine, preempted = _run(folders["target"], spec)
    assert preempted > 0, "the tiny pool must preempt"
    assert engine.pool_stats().used == 0, "pages leaked"
    assert _summary(done) == _summary(plain)
    for rid in done:  # logprobs of the accepted tokens
        for a, b in zip(done[rid].outputs, plain[rid].outputs):
            if b.logprobs is not None:
                assert len(a.logprobs) == len(b.logprobs) == len(b.token_ids)
                for da, db in zip(a.logprobs, b.logprobs):
                    assert da.keys() == db.keys()
                    assert all(abs(da[t].logprob - db[t].logprob) < 1e-4 for t in da)
    stats = engine.spec_decode_stats()
    assert stats["num_draft_tokens"] > 0 and stats["num_drafts"] > 0
    m = done["0"].metrics
    assert m.num_draft_tokens > 0 and 0.0 <= m.acceptance_rate <= 1.0
    assert m.mean_accepted_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    assert done["6"].metrics.num_draft_tokens == 0  # penalties: no proposals
    if kind == "draft_is_target":  # the draft is the target: greedy proposals all accepted
        assert stats["num_accepted_tokens"] == stats["num_draft_tokens"]
        assert m.acceptance_rate == 1.0 and m.mean_accepted_length > 2


def test_seeded_sampling_reproducible(folders):
    spec = {"model": folders["draft"], "num_speculative_tokens": 3}
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=20, ignore_eos=True)
              for s in range(4)] + [SamplingParams(temperature=1.0, top_k=5, seed=9, n=2,
                                                   max_tokens=15, ignore_eos=True)]
    runs = []
    for _ in range(2):
        llm = LLM(folders["target"], max_model_len=128, num_pages=40, page_size=8,
                  max_num_seqs=8, speculative_config=spec)
        outs = llm.generate(PROMPTS[:5], params, use_tqdm=False)
        runs.append([[o.token_ids for o in out.outputs] for out in outs])
        assert llm.llm_engine.pool_stats().used == 0
        assert all(len(t) == p.max_tokens for out, p in zip(runs[-1], params) for t in out)
    assert runs[0] == runs[1]
