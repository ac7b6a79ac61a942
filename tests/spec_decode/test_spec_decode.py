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
    from tests.utils.spec_models import make_tiny_llama

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


# ---------------------------------------------------------------------------- distribution
def _chi2_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's chi-square p-value; cells expecting < 5 are pooled into one."""
    from scipy import stats

    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_rejection_sampler_keeps_target_distribution():
    """The device function alone: 20,000 rows with 2 proposals drawn from q."""
    import jax.numpy as jnp

    from pagedjax.sample import sampler as S
    from pagedjax.spec_decode import rejection as rj

    V, K, R = 6, 2, 20000
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(K + 1, V)) * 1.5
    q = np.exp(rng.normal(size=(K, V)) * 1.5)
    q /= q.sum(-1, keepdims=True)
    p = np.exp(logits / 0.8)
    p /= p.sum(-1, keepdims=True)
    drafts = np.stack([rng.choice(V, size=R, p=q[j]) for j in range(K)], 1).astype(np.int32)
    states = [S.RowState(SamplingParams(temperature=0.8, seed=r), [0], [], num_placeholders=j)
              for r in range(R) for j in range(K + 1)]
    st = S.build_sampling_tensors(states, R * (K + 1), V, 16)
    vi = rj.VerifyInputs(np.tile(np.arange(K + 1, dtype=np.int32), (R, 1)), drafts,
                         np.full(R, K, np.int32), np.zeros(R, np.int32), st)
    out = rj.verify_jit(jnp.asarray(logits, jnp.float32), vi, jnp.asarray(q[None], jnp.float32))
    tok, n = np.asarray(out.tokens), np.asarray(out.num_out)
    assert 0.1 < (n > 1).mean() < 0.9, "some proposals accepted, some rejected"
    for j in range(K + 1):
        emitted = n > j
        counts = np.bincount(tok[emitted, j], minlength=V)
        assert _chi2_pvalue(counts, p[j] * emitted.sum()) > 1e-3, f"position {j}"
    # The same test has power: the proposal distribution itself is rejected.
    assert _chi2_pvalue(np.bincount(tok[:, 0], minlength=V), q[0] * R) < 1e-6


def test_engine_samples_keep_target_distribution(tmp_path):
    """3,000 seeded requests through the engine with a draft model whose
    distribution differs from the target's: the joint distribution of the first
    three tokens (the 2nd and 3rd come from verified steps: accepted proposals,
    residual draws and bonus tokens) matches the target's exact probabilities,
    computed by the engine without speculation."""
    from tests.utils.spec_models import make_tiny_llama

    V, N, T = 6, 3000, 0.8
    target = make_tiny_llama(str(tmp_path / "t"), V, 2, seed=0, scale=0.6)
    draft = make_tiny_llama(str(tmp_path / "d"), V, 1, seed=3, scale=0.6)
    prompt = [1, 3, 4, 0]
    kw = dict(max_model_len=32, num_pages=200, page_size=8, max_num_seqs=64)
    prefixes = [()] + [(a,) for a in range(V)] + [(a, b) for a in range(V) for b in range(V)]
    cond = _next_token_probs(target, [prompt + list(x) for x in prefixes], T)
    cond = dict(zip(prefixes, cond))
    joint = np.einsum("a,ab,abc->abc", cond[()], np.array([cond[(a,)] for a in range(V)]),
                      np.array([[cond[(a, b)] for b in range(V)] for a in range(V)]))
    llm = LLM(target, speculative_config={"model": draft, "num_speculative_tokens": 2}, **kw)
    outs = llm.generate([prompt] * N, [SamplingParams(temperature=T, seed=s, max_tokens=4,
                                                      ignore_eos=True) for s in range(N)],
                        use_tqdm=False)
    assert llm.llm_engine.pool_stats().used == 0
    stats = llm.llm_engine.spec_decode_stats()
    rate = stats["num_accepted_tokens"] / stats["num_draft_tokens"]
    assert 0.1 < rate < 0.9, f"the draft must be accepted sometimes and rejected often ({rate})"
    counts = np.zeros((V, V, V))
    for o in outs:
        a, b, c = o.outputs[0].token_ids[:3]
        counts[a, b, c] += 1
    p = _chi2_pvalue(counts.ravel(), joint.ravel() * N)
    print(f"acceptance {rate:.3f}, chi-square p={p:.3f}")
    assert p > 1e-3, f"chi-square p={p:.2g}: samples do not follow the target"
    # Power: the draft model's own distribution is clearly rejected by the same test.
    dq = _next_token_probs(draft, [prompt + list(x) for x in prefixes[:1 + V]], T)
    draft_pair = dq[0][:, None] * np.array(dq[1:])
    assert _chi2_pvalue(counts.sum(2).ravel(), draft_pair.ravel() * N) < 1e-6


def _next_token_probs(folder: str, prompts: list[list[int]], temperature: float) -> list:
    """The exact sampling distribution after each prompt, from transformers' model."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64)
    with torch.no_grad():
        out = []
        for ids in prompts:
            logits = hf(torch.tensor([ids])).logits[0, -1]
            out.append(torch.softmax(logits / temperature, -1).numpy())
    return out
