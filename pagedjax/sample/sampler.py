"""Token sampling on device: pure jnp, jit-able, static shapes.

Per row of a padded batch, in vLLM V1's order:

1. logprobs (if asked) from the *raw* logits: log_softmax before anything else;
2. allowed-token mask, bans (bad words, stop ids before ``min_tokens``) and
   ``logit_bias`` (one scatter-add of a fixed-width edit list);
3. penalties: repetition (prompt + output tokens), frequency and presence
   (output tokens only);
4. greedy rows (temperature 0) take the argmax here;
5. temperature, then min-p, then top-k, then top-p (on the distribution
   renormalised after top-k), then one draw by inverse CDF.

The draw uses one uniform per row from a per-row threefry key:
``fold_in(key(seed), num_output_tokens)``. A seeded request's tokens therefore
depend only on its seed, its logits and its position in its own output; never
on its row or its neighbours. Unseeded rows use the engine's fallback seed the
same way. Inverse CDF needs one exp per logit and a blocked prefix sum, which
on CPU is far cheaper than a Gumbel draw per logit (measured at R=256,
V=49152: ~0.8 s for the Gumbel noise alone).

Top-k/top-p avoid a full sort: ``lax.top_k`` of ``TOPK_CAP`` candidates gives
the threshold whenever top_k <= TOPK_CAP and the top-p nucleus ends inside the
candidates. Otherwise (checked on device) a ``lax.cond`` branch finds the
thresholds by bisection over the logit values (exact to 2^-20 of the logit range).

On the CPU platform, steps 4-5 (the draw) run as one C++ pass per row
(kernels_pallas/cpu/sampler.cc, ``backend="auto"``): the same rules on the same
uniforms, thresholds from a histogram of exp's float bits instead of
``lax.top_k``, 5-40x cheaper than the jnp path at 128 rows of a 49,152-token
vocabulary (benchmarks/kernel_bench/sampler.py). The jnp path stays for accelerators, for
machines without a C++ compiler and as the reference the tests compare with.
Logprobs cost nothing unless asked (``num_logprobs=None``).

Host side (``sampling_tensors.py``): ``build_sampling_tensors`` turns per-row
``RowState``s into a ``SamplingTensors`` pytree of numpy arrays. Features that cost device work
(penalties, bias/bans, allowed tokens, min-p, top-k/top-p) are static flags so
the common path compiles lean; their array widths are module constants, so the
number of compiled variants is bounded by the flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

# The host side of sampling (per-row state -> arrays) is metadata.py; the names below
# are part of this module's public interface too (the runner and tests use them).
from pagedjax.sample.metadata import (  # noqa: F401
    BAN_WIDTH,
    EDIT_WIDTH,
    MAX_EOS_TOKEN_IDS,
    RowState,
    SamplingTensors,
    build_sampling_tensors,
    static_row,
    variant_key,
)
from pagedjax.utils import cdiv

TOPK_CAP = 256
_BISECT_STEPS = 20


@dataclass
class SamplerOutput:
    """token_ids i32[R]; logprob f32[R] and rank i32[R] of the sampled token
    under the raw logits (rank 1 = best; zeros when logprobs were not asked);
    topk_ids i32[R,K] and topk_logprobs f32[R,K]."""

    token_ids: jax.Array
    logprob: jax.Array
    rank: jax.Array
    topk_ids: jax.Array
    topk_logprobs: jax.Array


jax.tree_util.register_dataclass(
    SamplerOutput, data_fields=["token_ids", "logprob", "rank", "topk_ids", "topk_logprobs"],
    meta_fields=[])


def pack_output(out: SamplerOutput) -> jax.Array:
    """The output as one i32[R, 3 + 2K] array (token, rank, logprob's bits, K top ids,
    K top logprobs' bits): one device-to-host copy a step instead of five."""
    def bits(x):
        return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)

    return jnp.concatenate([out.token_ids.astype(jnp.int32)[:, None],
                            out.rank.astype(jnp.int32)[:, None], bits(out.logprob)[:, None],
                            out.topk_ids.astype(jnp.int32), bits(out.topk_logprobs)], axis=1)


def unpack_output(packed: np.ndarray) -> SamplerOutput:
    """:func:`pack_output`'s array, fetched, back as a SamplerOutput of numpy views."""
    k = (packed.shape[1] - 3) // 2
    return SamplerOutput(packed[:, 0], packed[:, 2].view(np.float32), packed[:, 1],
                         packed[:, 3:3 + k], packed[:, 3 + k:].view(np.float32))


# ------------------------------------------------------------------------ device
def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[r, idx[r]] for 2-D x and 1-D idx."""
    return jnp.take_along_axis(x, idx[:, None], axis=1)[:, 0]


def _apply_allowed(x: jax.Array, bits: jax.Array) -> jax.Array:
    R, V = x.shape
    shifts = jnp.arange(32, dtype=jnp.uint32)
    mask = ((bits[:, :, None] >> shifts) & 1).reshape(R, -1)[:, :V]
    return jnp.where(mask > 0, x, -jnp.inf)


def _apply_penalties(x: jax.Array, st: SamplingTensors) -> jax.Array:
    rows = jnp.arange(x.shape[0])[:, None]
    ids, cnt = st.hist_ids, st.hist_counts
    old = jnp.take_along_axis(x, ids, axis=1, mode="clip")
    rp = st.repetition[:, None]
    new = jnp.where(old > 0, old / rp, old * rp)
    new = new - st.frequency[:, None] * cnt - st.presence[:, None] * (cnt > 0)
    return x.at[rows, ids].set(new, mode="drop")


def _row_uniforms(key_data: jax.Array, counter: jax.Array) -> jax.Array:
    def one(kd, c):
        key = jax.random.fold_in(jax.random.wrap_key_data(kd, impl="threefry2x32"), c)
        return jax.random.uniform(key, (), jnp.float32)
    return jax.vmap(one)(key_data, counter)


def _block_size(V: int) -> int:
    for b in (256, 512, 128, 1024, 64):
        if V % b == 0:
            return b
    return 256


def _inverse_cdf(e: jax.Array, u: jax.Array) -> jax.Array:
    """Index drawn with probability e[r, i] / sum(e[r]) (e >= 0); blocked prefix sums."""
    R, V = e.shape
    B = _block_size(V)
    nb = cdiv(V, B)
    if nb * B != V:
        e = jnp.pad(e, ((0, 0), (0, nb * B - V)))
    eb = e.reshape(R, nb, B)
    bsum = eb.sum(-1)
    bcum = jnp.cumsum(bsum, -1)
    total = bcum[:, -1]
    target = jnp.minimum(u * total, total * (1.0 - 2.0 ** -20))
    b = jnp.minimum(jnp.sum(bcum <= target[:, None], -1), nb - 1)
    blk = jnp.take_along_axis(eb, b[:, None, None], axis=1)[:, 0]
    before = _take(bcum - bsum, b)
    c = jnp.cumsum(blk, -1)
    t2 = jnp.clip(target - before, 0.0, c[:, -1] * (1.0 - 2.0 ** -20))
    j = jnp.minimum(jnp.sum(c <= t2[:, None], -1), B - 1)
    return (b * B + j).astype(jnp.int32)


def _bisect(lo, hi, pred):
    """Largest t in [lo, hi] with pred(t) (pred monotone, pred(lo) true), to 2^-20."""
    def body(_, lh):
        lo, hi = lh
        mid = 0.5 * (lo + hi)
        ok = pred(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)
    lo, hi = jax.lax.fori_loop(0, _BISECT_STEPS, body, (lo, hi))
    return jnp.where(pred(hi), hi, lo)


def _threshold_slow(z, e, m, k, p):
    """Top-k then top-p thresholds by bisection over logit values (all rows)."""
    finite = jnp.isfinite(z)
    lo0 = jnp.min(jnp.where(finite, z, m[:, None]), -1)
    count = lambda t: jnp.sum(z >= t[:, None], -1) >= k
    k_big = (k > min(TOPK_CAP, z.shape[1])) & (k < z.shape[1])
    tk = jax.lax.cond(jnp.any(k_big), lambda: _bisect(lo0, m, count), lambda: lo0)
    ek = jnp.where(z >= tk[:, None], e, 0.0)
    zk = jnp.sum(ek, -1)
    mass = lambda t: jnp.sum(jnp.where(z >= t[:, None], ek, 0.0), -1) >= p * zk
    tp = _bisect(tk, m, mass)
    return jnp.where(p < 1.0, tp, tk)


def _top_k_p_threshold(z, e, m, k, p):
    """Per-row logit threshold: keep z >= thr. k: i32[R] (V = off), p: f32[R]."""
    R, V = z.shape
    cap = min(TOPK_CAP, V)
    vals, _ = jax.lax.top_k(z, cap)
    pos = jnp.arange(cap)[None, :]
    in_k = pos < k[:, None]
    ce = jnp.where(in_k, jnp.exp(vals - m[:, None]), 0.0)
    k_small = k <= cap
    zk = jnp.where(k_small, ce.sum(-1), e.sum(-1))
    excl = jnp.cumsum(ce, -1) - ce
    keep = in_k & ((excl < (p * zk)[:, None]) | (p >= 1.0)[:, None])
    n_keep = jnp.maximum(jnp.sum(keep, -1), 1)
    thr = _take(vals, n_keep - 1)
    k_off = k >= V
    thr = jnp.where(k_off & (p >= 1.0), -jnp.inf, thr)
    nucleus_inside = jnp.sum(ce, -1) >= p * zk
    ok = k_small | (k_off & ((p >= 1.0) | nucleus_inside))
    return jax.lax.cond(jnp.all(ok), lambda: thr,
                        lambda: jnp.where(ok, thr, _threshold_slow(z, e, m, k, p)))


def _logprob_outputs(raw, tok, num_logprobs):
    R = raw.shape[0]
    if num_logprobs is None:
        return (jnp.zeros(R, jnp.float32), jnp.zeros(R, jnp.int32),
                jnp.zeros((R, 0), jnp.int32), jnp.zeros((R, 0), jnp.float32))
    return _token_logprobs(raw, tok, num_logprobs)


def _token_logprobs(logits, tok, k):
    lse = jax.nn.logsumexp(logits, axis=-1)
    val = _take(logits, tok)
    rank = jnp.sum(logits >= val[:, None], -1).astype(jnp.int32)
    if k > 0:
        tv, ti = jax.lax.top_k(logits, k)
        topk_ids, topk_lp = ti.astype(jnp.int32), tv - lse[:, None]
    else:
        topk_ids = jnp.zeros((logits.shape[0], 0), jnp.int32)
        topk_lp = jnp.zeros((logits.shape[0], 0), jnp.float32)
    return val - lse, rank, topk_ids, topk_lp


def process_logits(logits: jax.Array, st: SamplingTensors) -> jax.Array:
    """Allowed-token mask, bans + logit_bias, then penalties (before temperature)."""
    x = logits.astype(jnp.float32)
    if st.use_allowed:
        x = _apply_allowed(x, st.allowed_bits)
    if st.use_edits:
        rows = jnp.arange(x.shape[0])[:, None]
        x = x.at[rows, st.edit_ids].add(st.edit_vals)
    if st.use_penalties:
        x = _apply_penalties(x, st)
    return x


def _weights(x: jax.Array, st: SamplingTensors):
    """(argmax i32[R], unnormalised sampling weights f32[R,V] or None if all greedy)."""
    z = x / st.temperature[:, None]
    best = jnp.argmax(z, axis=-1).astype(jnp.int32)
    if st.all_greedy:
        return best, None
    m = _take(z, best)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    if st.use_min_p:
        z = jnp.where(z >= (m + jnp.log(st.min_p))[:, None], z, -jnp.inf)
    e = jnp.exp(z - m[:, None])
    if st.use_top_k_p:
        thr = _top_k_p_threshold(z, e, m, st.top_k, st.top_p)
        e = jnp.where(z >= thr[:, None], e, 0.0)
    return best, e


def sampling_probs(logits: jax.Array, st: SamplingTensors) -> jax.Array:
    """The distribution each row draws from, f32[R, V] (one-hot for greedy rows)."""
    best, e = _weights(process_logits(logits, st), st)
    onehot = jax.nn.one_hot(best, logits.shape[-1], dtype=jnp.float32)
    if e is None:
        return onehot
    return jnp.where(st.greedy[:, None], onehot, e / e.sum(-1, keepdims=True))


def resolve_backend(backend: str = "auto") -> str:
    """"native" (the C++ draw, kernels_pallas/cpu/sampler.py) or "xla" (jnp).

    ``auto``: native on the CPU platform when the C++ sampler builds, else xla.
    """
    if backend not in ("auto", "native", "xla"):
        raise ValueError(f"backend: expected 'auto', 'native' or 'xla', got {backend!r}")
    if backend == "auto":
        from pagedjax.kernels_pallas.cpu import sampler as cpu_sampler

        native = jax.default_backend() == "cpu" and cpu_sampler.available()
        return "native" if native else "xla"
    return backend


def program_flags(st: SamplingTensors, backend: str = "auto") -> SamplingTensors:
    """``st`` with the feature flags that do not change ``backend``'s program
    cleared. The C++ draw reads every row's top_k, top_p and min_p (neutral
    values where a row has none) whatever the flags say, so on "native" the
    min-p and top-k/top-p flags only multiplied the compiled variants; the
    tokens are the same either way."""
    if not (st.use_min_p or st.use_top_k_p) or resolve_backend(backend) != "native":
        return st
    # A shallow copy with two fields changed (per step: dataclasses.replace and
    # copy.copy take their generic paths).
    out = object.__new__(SamplingTensors)
    out.__dict__.update(st.__dict__)
    out.use_min_p = out.use_top_k_p = False
    return out


def sample(logits: jax.Array, st: SamplingTensors,
           num_logprobs: Optional[int] = None, *, backend: str = "auto") -> SamplerOutput:
    """Sample one token per row. logits f32[R, V]; num_logprobs and backend static.

    ``num_logprobs=None`` skips logprob work (logprob/rank are zeros);
    0 gives the sampled token's logprob and rank; k > 0 adds the top k.
    ``backend``: see ``resolve_backend``; both follow the same rules and use
    the same per-row uniforms, so a seeded row draws the same token on either
    except where float rounding puts a uniform within ~1e-6 of a boundary.
    """
    raw = logits.astype(jnp.float32)
    x = process_logits(raw, st)
    if resolve_backend(backend) == "native":
        from pagedjax.kernels_pallas.cpu import sampler as cpu_sampler

        R = x.shape[0]
        u = (jnp.zeros(R, jnp.float32) if st.all_greedy
             else _row_uniforms(st.key_data, st.counter))
        tok = cpu_sampler.sample(x, st.temperature, st.greedy, st.top_k, st.top_p, st.min_p, u)
        lp, rank, ti, tl = _logprob_outputs(raw, tok, num_logprobs)
        return SamplerOutput(tok, lp, rank, ti, tl)
    best, e = _weights(x, st)
    if e is None:
        tok = best
    else:
        drawn = _inverse_cdf(e, _row_uniforms(st.key_data, st.counter))
        tok = jnp.where(st.greedy, best, drawn)
    lp, rank, ti, tl = _logprob_outputs(raw, tok, num_logprobs)
    return SamplerOutput(tok, lp, rank, ti, tl)


def prompt_logprobs(logits: jax.Array, next_token_ids: jax.Array, k: int):
    """Logprobs of the given next tokens under raw logits f32[N, V].

    Returns (token_logprob f32[N], rank i32[N], topk_ids i32[N,k], topk_logprobs f32[N,k]).
    """
    return _token_logprobs(logits.astype(jnp.float32), next_token_ids.astype(jnp.int32), k)


sample_jit = jax.jit(sample, static_argnames=("num_logprobs", "backend"))
prompt_logprobs_jit = jax.jit(prompt_logprobs, static_argnames=("k",))
