"""LLM.embed on a tiny random Qwen3 equals transformers' pooled hidden states (last
token and mean, normalised, Matryoshka dimensions), across prefill chunks, with
prefix-cache hits, and in one batch with generation requests."""

from __future__ import annotations

import numpy as np
import pytest

from pagedjax import SamplingParams
from pagedjax.entrypoints.pooling import pool, pooling_params
from tests.utils.qwen3_tiny import build_random_qwen3, hf_embed

TOL = 1e-4  # float32 on both sides, unit-norm vectors (absolute, per component)
TEXTS = ["the river is by the garden", "music in the city at night " * 4, "water"]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_random_qwen3(str(tmp_path_factory.mktemp("qwen3_embed")), seed=1)


@pytest.fixture(scope="module")
def llm(qwen3_dir):
    from pagedjax import LLM

    # 32-token steps: the long text is prefilled in several chunks
    return LLM(qwen3_dir, max_model_len=256, max_num_seqs=8, num_pages=64,
               max_num_batched_tokens=32)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embed_matches_transformers(llm, qwen3_dir, pooling):
    got = llm.embed(TEXTS, pooling=pooling, use_tqdm=False)
    ref = hf_embed(qwen3_dir, TEXTS, pooling)
    assert len(got[1].prompt_token_ids) > 32  # prefilled in more than one chunk
    for o, r in zip(got, ref):
        v = np.asarray(o.outputs.embedding)
        assert v.shape == r.shape and np.abs(v - r).max() < TOL
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
    # Matryoshka: the first d components, normalised again
    d16 = llm.embed(TEXTS[:1], pooling=pooling, dimensions=16, use_tqdm=False)
    r16 = hf_embed(qwen3_dir, TEXTS[:1], pooling, dims=16)[0]
    assert len(d16[0].outputs.embedding) == 16
    assert np.abs(np.asarray(d16[0].outputs.embedding) - r16).max() < TOL


def test_embed_prefix_cache_and_mixed_batch(llm, qwen3_dir, monkeypatch):
    solo = [np.asarray(o.outputs.embedding) for o in llm.embed(TEXTS, use_tqdm=False)]
    again = llm.embed(TEXTS, use_tqdm=False)  # prompts now in the prefix cache
    for a, b in zip(again, solo):
        assert np.abs(np.asarray(a.outputs.embedding) - b).max() < TOL
    gen = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["the old house"], gen, use_tqdm=False)[0].outputs[0].token_ids
    # one engine, generation and pooling requests in the same steps; every sampler
    # row the runner is given is recorded (the real launch runs)
    eng = llm.llm_engine
    runner = eng.core.runner
    sampled_ids: list[str] = []
    launch = runner.launch

    def recording_launch(rows, *args, **kw):
        # the step's sampling rows: each row that samples, then the forks of n > 1 prompts
        sampled_ids.extend(r.request_id for r in rows if r.num_samples)
        sampled_ids.extend(rows[i].request_id for i, _ in kw.get("forks", ()))
        return launch(rows, *args, **kw)

    monkeypatch.setattr(runner, "launch", recording_launch)
    eng.add_request("g", "the old house", gen)
    for i, t in enumerate(TEXTS):
        eng.add_request(f"e{i}", t, pooling_params("mean"))
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert done["g"].outputs[0].token_ids == alone
    # pooling requests never reach the sampler: the generation's 12 rows only
    assert sampled_ids == ["g"] * 12
    for i in range(len(TEXTS)):
        o = done[f"e{i}"].outputs[0]
        assert o.token_ids == [] and o.finish_reason == "length"
    assert eng.core.scheduler.stats().used == 0
    ref = hf_embed(qwen3_dir, TEXTS, "mean")
    for i in range(len(TEXTS)):
        v = pool(done[f"e{i}"].prompt_hidden_states, "mean")
        assert np.abs(v - ref[i]).max() < TOL


def test_embed_bad_arguments(llm):
    with pytest.raises(ValueError, match="pooling"):
        llm.embed("x", pooling="cls")
    with pytest.raises(ValueError, match="dimensions"):
        llm.embed("x", dimensions=10**6)
    with pytest.raises(ValueError, match="prompt_hidden_states"):
        SamplingParams(prompt_hidden_states="first")
    with pytest.raises(ValueError, match=r"max_tokens=0 \(prefill only\) needs prompt_hidden"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="n must be 1"):
        SamplingParams(max_tokens=0, n=2, prompt_hidden_states="last")
