"""The C++ sampler (kernels_pallas/cpu/sampler.cc) against numpy references.

tests/sample/test_sampler.py runs every token-drawing test on both draw paths; here:
the native draw's distribution against a numpy reference (chi-square, fixed
seeds), exact agreement with a float64 inverse-CDF reference and with the jnp
path, ties / -inf / odd vocabulary sizes, and batch invariance.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.kernels_pallas.cpu import build as cpu_build, sampler as cpu_sampler
from pagedjax.sample.sampler import RowState, build_sampling_tensors, sample_jit
from pagedjax.sampling_params import SamplingParams as SP
from tests.kernels_pallas.test_cpu_native import _flag_id, build_path

pytestmark = pytest.mark.skipif(not cpu_sampler.available(),
                                reason=f"C++ sampler: {cpu_sampler.unavailable_reason()}")

_call = jax.jit(cpu_sampler.sample)


def _ref_probs(x, T, k, p, min_p):
    """vLLM V1 order in float64 with a full sort: min-p, top-k, top-p on the top-k mass."""
    z = np.asarray(x, np.float64) / T
    z = np.where(np.exp(z - z.max()) >= min_p, z, -np.inf)
    if 0 < k < len(z):
        z = np.where(z >= np.sort(z)[::-1][k - 1], z, -np.inf)
    if p < 1:
        order = np.argsort(-z, kind="stable")
        e = np.exp(z[order] - z.max())
        excl = np.cumsum(e) - e
        z[order[excl >= p * e.sum()]] = -np.inf
    e = np.exp(z - z.max())
    return e / e.sum()


def _run(x, T, k, p, min_p, u, greedy=None):
    R, V = x.shape
    full = lambda v, dt: jnp.full(R, v, dt)  # noqa: E731
    g = jnp.zeros(R, bool) if greedy is None else jnp.asarray(greedy)
    return np.asarray(_call(jnp.asarray(x, jnp.float32), full(T, jnp.float32), g,
                            full(k or V, jnp.int32), full(p, jnp.float32),
                            full(min_p, jnp.float32), jnp.asarray(u, jnp.float32)))


CASES = [(1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.6, 0.0), (0.9, 12, 0.8, 0.0),
         (1.0, 0, 1.0, 0.1), (1.1, 0, 0.9, 0.05), (0.5, 1, 1.0, 0.0), (2.0, 40, 0.99, 0.0)]


@pytest.mark.parametrize("T,k,p,min_p", CASES)
def test_distribution_chi_square(T, k, p, min_p):
    V, n = 50, 20000
    x = np.random.default_rng(3).standard_normal(V) * 1.5
    u = np.random.default_rng(4).random(n)
    toks = _run(np.tile(x, (n, 1)), T, k, p, min_p, u)
    ref = _ref_probs(x, T, k, p, min_p)
    assert set(np.unique(toks)) <= set(np.nonzero(ref > 0)[0])
    keep = ref > 0
    counts = np.bincount(toks, minlength=V)[keep]
    chi2 = ((counts - n * ref[keep]) ** 2 / (n * ref[keep])).sum()
    df = max(int(keep.sum()) - 1, 1)
    assert chi2 < df + 6 * np.sqrt(2 * df) + 10, (chi2, df)


@pytest.mark.parametrize("V", [37, 1024, 49152])
def test_inverse_cdf_matches_float64_reference(V):
    """Given the same uniform, the token is the float64 reference's (up to rounding at
    a boundary: at most 1% of rows), for rows of every case."""
    rng = np.random.default_rng(V)
    mism, total = 0, 0
    for T, k, p, min_p in CASES:
        x = rng.standard_normal((24, V)) * 2.5
        u = rng.random(24)
        toks = _run(x, T, k, p, min_p, u)
        for r in range(24):
            c = np.cumsum(_ref_probs(x[r], T, k, p, min_p))
            want = min(int(np.searchsorted(c, u[r] * c[-1], side="right")), V - 1)
            mism += toks[r] != want
            total += 1
    assert mism <= 0.01 * total + 1, (mism, total)


def test_greedy_ties_infs_and_odd_sizes():
    x = np.full((4, 37), -np.inf, np.float32)
    x[0, [3, 20, 36]] = 5.0            # tie: the first index wins
    x[1, 36] = 0.0                      # only the tail element is finite
    x[2, :] = 1.0                       # all equal
    # row 3: all -inf -> index 0 (nothing to choose)
    got = _run(x, 1.0, 0, 1.0, 0.0, np.zeros(4), greedy=np.ones(4, bool))
    np.testing.assert_array_equal(got, [3, 36, 0, 0])
    # sampling never picks a -inf logit, even with top-k larger than the finite set
    y = np.full((64, 45), -np.inf, np.float32)
    y[:, [1, 17, 44]] = [0.0, 1.0, 2.0]
    u = np.random.default_rng(0).random(64)
    for k, p in [(0, 1.0), (10, 1.0), (10, 0.999), (0, 0.5)]:
        toks = _run(y, 1.0, k, p, 0.0, u)
        assert set(toks.tolist()) <= {1, 17, 44}, (k, p, toks)


def test_batch_invariance_and_matches_jnp_path():
    V, R = 4096, 24
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((R, V)) * 3, jnp.float32)
    params = [SP(temperature=t, top_k=k, top_p=p, min_p=m, seed=100 + i)
              for i, (t, k, p, m) in enumerate(CASES * 3)]
    rows = [RowState(q, [1], [2, 3]) for q in params]
    st = build_sampling_tensors(rows, R, V, 8)
    native = np.asarray(sample_jit(x, st, backend="native").token_ids)
    xla = np.asarray(sample_jit(x, st, backend="xla").token_ids)
    assert (native != xla).sum() <= 1, (native, xla)  # same rules, same uniforms
    for r in (0, 5, 23):  # a row alone draws what it drew among other rows
        alone = build_sampling_tensors([rows[r]], 1, V, 8)
        assert int(sample_jit(x[r:r + 1], alone, backend="native").token_ids[0]) == native[r]


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="x: expected logits"):
        cpu_sampler.sample(jnp.zeros(4), *[jnp.zeros(4)] * 6)


@pytest.mark.parametrize("flags", cpu_build.default_flag_sets(), ids=_flag_id)
def test_every_build_path_draws_from_the_reference(flags):
    """The sampler built for each instruction-set path (skipped, naming why, where this
    machine cannot run it) draws the float64 reference's token from the same uniform."""
    lib = build_path(cpu_sampler.SOURCE, "cpu_sampler", flags)
    assert lib.PagedjaxSelfTest() == 0
    target = f"pagedjax_sample_path_{abs(hash(tuple(flags)))}"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.PagedjaxSample), platform="cpu")
    rng = np.random.default_rng(11)
    V, R = 3001, 32
    mism = 0
    for T, k, p, min_p in CASES:
        x = (rng.standard_normal((R, V)) * 2.5).astype(np.float32)
        u = rng.random(R).astype(np.float32)
        per_row = [np.full(R, v, dt) for v, dt in ((T, np.float32), (0, np.int32),
                                                   (k or V, np.int32), (p, np.float32),
                                                   (min_p, np.float32))]
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((R,), jnp.int32))
        toks = np.asarray(jax.jit(call)(x, *per_row, u))
        for r in range(R):
            c = np.cumsum(_ref_probs(x[r], T, k, p, min_p))
            mism += toks[r] != min(int(np.searchsorted(c, u[r] * c[-1], side="right")), V - 1)
    assert mism <= 0.01 * R * len(CASES) + 1, mism
