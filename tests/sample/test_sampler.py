import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.sample.sampler import (
    TOPK_CAP,
    RowState,
    build_sampling_tensors,
    process_logits,
    prompt_logprobs,
    sample,
    sample_jit,
    sampling_probs,
)
from pagedjax.kernels_pallas.cpu import sampler as cpu_sampler
from pagedjax.sampling_params import SamplingParams as SP

V = 64
# Both draw paths: jnp ("xla") and the C++ sampler ("native", where it builds).
BACKENDS = ["xla", pytest.param("native", marks=pytest.mark.skipif(
    not cpu_sampler.available(), reason=f"C++ sampler: {cpu_sampler.unavailable_reason()}"))]


def _rows(params_list, prompt=(1, 2, 3), output=(), seeds=None, **kw):
    seeds = seeds if seeds is not None else range(len(params_list))
    return [RowState(p, list(prompt), list(output), fallback_seed=s, **kw)
            for p, s in zip(params_list, seeds)]


def _st(rows, R=None, vocab=V, H=64):
    return build_sampling_tensors(rows, R or len(rows), vocab, H)


def _logits(R, vocab=V, seed=0, scale=2.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((R, vocab)) * scale,
                       jnp.float32)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_is_argmax_and_padding_rows(backend):
    x = _logits(6)
    st = _st(_rows([SP(temperature=0)] * 4), R=6)
    assert st.all_greedy
    out = sample_jit(x, st, backend=backend)
    np.testing.assert_array_equal(out.token_ids, np.argmax(np.asarray(x), -1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_temperature_distribution_matches_softmax(backend):
    n, v, T = 20000, 6, 0.7
    x = jnp.tile(jnp.array([[1.0, 0.5, 0.0, -0.5, 2.0, -3.0]]), (n, 1))
    st = build_sampling_tensors(_rows([SP(temperature=T)] * n), n, v, 8)
    toks = np.asarray(sample_jit(x, st, backend=backend).token_ids)
    p = np.exp(_log_softmax(np.asarray(x[0]) / T))
    counts = np.bincount(toks, minlength=v)
    chi2 = ((counts - n * p) ** 2 / (n * p)).sum()
    assert chi2 < 25.0, (counts, n * p)  # df=5: p(chi2 > 25) ~ 1e-4


def _ref_support(x, T, k, p, min_p):
    """vLLM V1 reference with a full sort: min-p, then top-k, then top-p."""
    z = np.asarray(x, np.float64) / T
    pr = np.exp(z - z.max())
    z = np.where(pr >= min_p * pr.max(), z, -np.inf)
    if k:
        kth = np.sort(z)[::-1][k - 1]
        z = np.where(z >= kth, z, -np.inf)
    if p < 1:
        order = np.argsort(z, kind="stable")
        probs = np.exp(z[order] - z.max())
        probs /= probs.sum()
        cut = np.cumsum(probs) <= 1 - p
        cut[-1] = False
        z[order[cut]] = -np.inf
    return np.isfinite(z)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", [V, 4 * TOPK_CAP])  # the second exercises the slow path
def test_top_k_top_p_min_p_support(vocab, backend):
    cases = [dict(top_k=5), dict(top_p=0.5), dict(top_p=0.9, top_k=20), dict(min_p=0.2),
             dict(min_p=0.05, top_p=0.8), dict(top_k=1), dict(top_p=0.999),
             dict(top_k=vocab // 2 + 1, top_p=0.95), dict(top_k=vocab - 3)]
    params = [SP(temperature=t, **c) for c in cases for t in (0.5, 1.3)]
    x = _logits(len(params), vocab, seed=1, scale=1.0 if vocab > V else 2.0)
    st = _st(_rows(params), vocab=vocab)
    probs = np.asarray(sampling_probs(x, st))
    for r, p in enumerate(params):
        want = _ref_support(np.asarray(x[r]), p.temperature, p.top_k, p.top_p, p.min_p)
        np.testing.assert_array_equal(probs[r] > 0, want, err_msg=f"{p}")
        z = np.asarray(x[r], np.float64) / p.temperature
        ref = np.where(want, np.exp(z - z.max()), 0)
        np.testing.assert_allclose(probs[r], ref / ref.sum(), rtol=1e-4, atol=1e-7)
    toks = np.asarray(sample_jit(x, st, backend=backend).token_ids)
    assert all(probs[r, t] > 0 for r, t in enumerate(toks))


def test_penalties_match_numpy_reference():
    prompt, output = [3, 3, 7, 9], [7, 7, 11, 3, 20]
    params = [SP(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25),
              SP(repetition_penalty=0.8), SP(presence_penalty=-1.0), SP()]
    x = _logits(4)
    st = _st(_rows(params, prompt=prompt, output=output))
    assert st.use_penalties
    got = np.asarray(process_logits(x, st))
    for r, p in enumerate(params):
        ref = np.asarray(x[r], np.float64).copy()
        seen = set(output) | (set(prompt) if p.repetition_penalty != 1 else set())
        for t in seen:
            ref[t] = ref[t] / p.repetition_penalty if ref[t] > 0 else ref[t] * p.repetition_penalty
        for t in set(output):
            ref[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
        np.testing.assert_allclose(got[r], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logit_bias_bans_allowed_and_min_tokens(backend):
    x = jnp.zeros((5, V)).at[:, 0].set(10.0)
    params = [SP(temperature=0, logit_bias={5: 50.0}),
              SP(temperature=0, min_tokens=3, stop_token_ids=[0]),
              SP(temperature=0, min_tokens=1),
              SP(temperature=0, allowed_token_ids=[9, 33]),
              SP(temperature=0, bad_words=["x"])]
    rows = _rows(params, output=[4, 8])
    rows[2].eos_token_ids = [0]
    rows[4].bad_words_token_ids = [[0], [8, 1]]  # one-token word, and "8 1" after 8
    st = _st(rows)
    assert st.use_edits and st.use_allowed and st.all_greedy
    toks = np.asarray(sample_jit(x, st, backend=backend).token_ids)
    assert toks[0] == 5 and toks[1] != 0 and toks[2] == 0 and toks[3] in (9, 33)
    probs = np.asarray(process_logits(x, st))
    assert np.isneginf(probs[4, [0, 1]]).all() and np.isfinite(probs[4, 2:]).all()
    assert np.isfinite(probs[3]).sum() == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_row_independent_of_position_and_neighbours(backend):
    base = np.asarray(_logits(1, seed=5, scale=0.5))[0]
    for seed, n_out in [(42, 0), (42, 7), (2**40 + 3, 1), (-5, 2)]:
        got = []
        for R, pos, nb_seed in [(8, 0, 1), (8, 5, 2), (16, 11, 3)]:
            x = np.array(_logits(R, seed=nb_seed))
            x[pos] = base
            ps = [SP(temperature=0.9, seed=nb_seed * 100 + i, top_p=0.95) for i in range(R)]
            ps[pos] = SP(temperature=1.0, seed=seed)
            rows = _rows(ps, output=[1] * 3)
            rows[pos] = RowState(ps[pos], [1, 2], [1] * n_out)
            got.append(int(sample_jit(jnp.asarray(x), _st(rows), backend=backend).token_ids[pos]))
        assert len(set(got)) == 1, (seed, got)
    # and the seed matters
    x = jnp.tile(jnp.asarray(base)[None], (32, 1))
    toks = sample_jit(x, _st(_rows([SP(seed=s) for s in range(32)])), backend=backend).token_ids
    assert len(set(np.asarray(toks).tolist())) > 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_and_ranks_match_numpy(backend):
    x = _logits(5)
    params = [SP(temperature=0), SP(temperature=0.8, logit_bias={3: 5.0}), SP(top_k=3),
              SP(temperature=0, repetition_penalty=2.0), SP(seed=1)]
    st = _st(_rows(params, output=[0, 1]))
    out = sample_jit(x, st, num_logprobs=4, backend=backend)
    ref = _log_softmax(np.asarray(x))
    toks = np.asarray(out.token_ids)
    for r in range(5):
        t = toks[r]
        np.testing.assert_allclose(out.logprob[r], ref[r, t], rtol=1e-5, atol=1e-5)
        assert out.rank[r] == 1 + (ref[r] > ref[r, t]).sum()
        np.testing.assert_array_equal(out.topk_ids[r], np.argsort(-ref[r])[:4])
        np.testing.assert_allclose(out.topk_logprobs[r], np.sort(ref[r])[::-1][:4], atol=1e-5)
    assert out.topk_ids.shape == (5, 4)
    out0 = sample_jit(x, st, num_logprobs=0, backend=backend)
    assert out0.topk_ids.shape == (5, 0)
    np.testing.assert_allclose(out0.logprob, out.logprob)


def test_prompt_logprobs():
    x = _logits(7)
    nxt = jnp.arange(7) * 3
    lp, rank, ti, tl = jax.jit(prompt_logprobs, static_argnames="k")(x, nxt, k=2)
    ref = _log_softmax(np.asarray(x))
    np.testing.assert_allclose(lp, ref[np.arange(7), np.asarray(nxt)], atol=1e-5)
    for r in range(7):
        assert rank[r] == 1 + (ref[r] > ref[r, 3 * r]).sum()
    np.testing.assert_array_equal(ti, np.argsort(-ref, -1)[:, :2])


def test_compiles_once_across_param_values():
    traces = []

    def f(logits, st):
        traces.append(1)
        return sample(logits, st, num_logprobs=None)

    jf = jax.jit(f)
    for i in range(4):
        params = [SP(temperature=0.5 + i * 0.1, top_k=3 + i, top_p=0.9 - 0.1 * i, seed=i),
                  SP(temperature=0), SP(temperature=1.0, top_k=10 + i)]
        jax.block_until_ready(jf(_logits(4, seed=i), _st(_rows(params), R=4)))
    assert len(traces) == 1
    jax.block_until_ready(jf(_logits(4), _st(_rows([SP(temperature=0)]), R=4)))
    assert len(traces) == 2  # all-greedy is its own (lean) program


def test_build_rejects_too_long_history():
    rows = _rows([SP(presence_penalty=1.0)], output=list(range(20)))
    with pytest.raises(ValueError, match="raise history_len"):
        build_sampling_tensors(rows, 1, V, 8)


def test_placeholders_count_as_outputs():
    """An overlapped step's row has outputs the host does not know yet: they count for
    the seed counter and min_tokens exactly like known tokens."""
    p_seed, p_min = SP(temperature=1.0, seed=9), SP(temperature=0, min_tokens=3, stop_token_ids=[0])
    known = _st([RowState(p_seed, [1], [4, 5, 6]), RowState(p_min, [1], [4, 5, 6])])
    pending = _st([RowState(p_seed, [1], [4], num_placeholders=2),
                   RowState(p_min, [1], [4], num_placeholders=2)])
    short = _st([RowState(p_seed, [1], [4], num_placeholders=1),
                 RowState(p_min, [1], [4], num_placeholders=1)])
    np.testing.assert_array_equal(known.counter, pending.counter)
    assert known.counter[0] == 3 and short.counter[0] == 2
    assert not known.use_edits and not pending.use_edits  # 3 outputs: min_tokens met
    assert short.use_edits and 0 in short.edit_ids[1].tolist()  # 2 outputs: stop id banned


@pytest.mark.parametrize("k", [0, 5])
def test_packed_output_round_trips(k):
    """pack_output's one array (the step's single device-to-host copy) unpacks to the same
    tokens, ranks, logprobs (bit for bit, -inf included) and top-k."""
    from pagedjax.sample.sampler import SamplerOutput, pack_output, unpack_output

    rng = np.random.default_rng(k)
    out = SamplerOutput(jnp.asarray(rng.integers(0, 49152, 7), jnp.int32),
                        jnp.asarray(np.r_[-np.inf, rng.standard_normal(6)], jnp.float32),
                        jnp.asarray(rng.integers(1, 100, 7), jnp.int32),
                        jnp.asarray(rng.integers(0, 49152, (7, k)), jnp.int32),
                        jnp.asarray(rng.standard_normal((7, k)), jnp.float32))
    back = unpack_output(np.asarray(jax.jit(pack_output)(out)))
    for name in ("token_ids", "logprob", "rank", "topk_ids", "topk_logprobs"):
        a, b = np.asarray(getattr(out, name)), getattr(back, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b)
