"""Rejection sampling of proposed tokens on the device (one jitted function of
fixed shape: rows x (k + 1) positions).

For each sampling row, positions j = 0..k: position j < num_draft verifies the
proposed token x_j, the position after the last accepted one emits a token.
With p_j the target's sampling distribution at position j (the row's
temperature, top-k/top-p/min-p, bias and bans, ``sampler.sampling_probs``)
and q_j the proposer's (one-hot for n-gram proposals, the draft model's own
sampling distribution otherwise):

* x_j is accepted with probability min(1, p_j(x_j) / q_j(x_j)), in order,
  until the first rejection (Leviathan et al. 2023);
* at the first rejected position the token is drawn from
  norm(max(0, p_j - q_j)); when every proposal was accepted the bonus token is
  drawn from p_k.

The emitted tokens are then distributed exactly as the target's own samples.
Greedy rows have one-hot p: a proposal is accepted iff it is the argmax, and
the emitted token is the argmax, so greedy output equals plain decoding.

Random numbers (the seeded stream): position j of a row whose request has
produced c tokens so far uses counter c + j of the row's seed key, like the
plain sampler: the draw uses ``uniform(fold_in(key(seed), c + j))`` (the very
uniform the plain sampler would use there), the acceptance test
``uniform(fold_in(fold_in(key, c + j), 1))`` and a draft model's proposal
``... fold_in(..., 2)``. The emitted tokens of a step depend only on the
uniforms of positions up to the first rejection, so the next step reusing the
later counters stays exact. Seeded runs are reproducible; they need not equal
the stream without speculation (as in vLLM).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.sample import sampler as sampler_mod
from pagedjax.sample.sampler import SamplingTensors

ACCEPT_TAG = 1
DRAFT_TAG = 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VerifyInputs:
    """Per sampling row r (R rows, K proposals at most), numpy on the host."""

    logit_rows: np.ndarray  # i32[R, K+1]: the logits row of each position
    draft_ids: np.ndarray  # i32[R, K]: proposed tokens (0-padded)
    num_draft: np.ndarray  # i32[R]: proposals of the row (0..K)
    q_row: np.ndarray  # i32[R]: the row's draft distributions in q, -1: one-hot proposals
    st: SamplingTensors  # R*(K+1) rows, row r position j at r*(K+1)+j (counter c+j)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VerifyOutput:
    """tokens i32[R, K+1] (-1 past num_out), num_out i32[R] (accepted + 1), and per
    emitted token its raw logprob f32[R, K+1], rank i32[R, K+1], top-k ids/logprobs
    [R, K+1, k] (zeros when logprobs were not asked)."""

    tokens: jax.Array
    num_out: jax.Array
    logprob: jax.Array
    rank: jax.Array
    topk_ids: jax.Array
    topk_logprobs: jax.Array


def uniforms(key_data: jax.Array, counter: jax.Array, tag: Optional[int] = None) -> jax.Array:
    """One uniform in [0, 1) per row from its seed key words u32[N, 2] and counter i32[N]."""
    def one(kd, c):
        key = jax.random.fold_in(jax.random.wrap_key_data(kd, impl="threefry2x32"), c)
        if tag is not None:
            key = jax.random.fold_in(key, tag)
        return jax.random.uniform(key, (), jnp.float32)
    return jax.vmap(one)(key_data, counter)


def draw(weights: jax.Array, u: jax.Array) -> jax.Array:
    """Index drawn with probability weights[r, i] / sum(weights[r]) (weights >= 0)."""
    cum = jnp.cumsum(weights, axis=-1)
    total = cum[:, -1]
    target = jnp.minimum(u * total, total * (1.0 - 2.0 ** -20))
    idx = jnp.sum(cum <= target[:, None], axis=-1)
    return jnp.minimum(idx, weights.shape[-1] - 1).astype(jnp.int32)


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[..., idx] along the last axis, idx with x's leading shape."""
    return jnp.take_along_axis(x, idx[..., None], axis=-1)[..., 0]


def verify(logits: jax.Array, vi: VerifyInputs, q: Optional[jax.Array],
           num_logprobs: Optional[int] = None) -> VerifyOutput:
    """logits f32[L, V] of the step; q f32[Rq, K, V] (draft distributions) or None."""
    R, K1 = vi.logit_rows.shape
    K = K1 - 1
    V = logits.shape[-1]
    raw = logits[vi.logit_rows.reshape(-1)].astype(jnp.float32)  # [R*K1, V]
    p = sampler_mod.sampling_probs(raw, vi.st).reshape(R, K1, V)
    x = vi.draft_ids
    onehot = jax.nn.one_hot(x, V, dtype=jnp.float32)  # [R, K, V]
    if q is None:
        qv = onehot
    else:
        qg = q[jnp.maximum(vi.q_row, 0)]
        qv = jnp.where((vi.q_row >= 0)[:, None, None], qg, onehot)
    px = _take(p[:, :K], x)
    qx = _take(qv, x)
    kd, ctr = vi.st.key_data, vi.st.counter
    u_acc = uniforms(kd, ctr, ACCEPT_TAG).reshape(R, K1)[:, :K]
    u_draw = uniforms(kd, ctr).reshape(R, K1)
    valid = jnp.arange(K)[None, :] < vi.num_draft[:, None]
    accept = (u_acc * qx < px) & valid
    n_acc = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)  # [R]
    rows = jnp.arange(R)
    p_at = p[rows, n_acc]
    rejected = n_acc < vi.num_draft
    if K > 0:
        resid = jnp.maximum(p_at - qv[rows, jnp.minimum(n_acc, K - 1)], 0.0)
        use_resid = rejected & (resid.sum(-1) > 0)
        dist = jnp.where(use_resid[:, None], resid, p_at)
    else:
        dist = p_at
    tok = draw(dist, u_draw[rows, n_acc])
    j = jnp.arange(K1)[None, :]
    xpad = jnp.concatenate([x, jnp.zeros((R, 1), x.dtype)], axis=1)
    tokens = jnp.where(j < n_acc[:, None], xpad, jnp.where(j == n_acc[:, None], tok[:, None], -1))
    tokens = tokens.astype(jnp.int32)
    if num_logprobs is None:
        z = jnp.zeros((R, K1), jnp.float32)
        return VerifyOutput(tokens, n_acc + 1, z, z.astype(jnp.int32),
                            jnp.zeros((R, K1, 0), jnp.int32), jnp.zeros((R, K1, 0), jnp.float32))
    lp, rank, ti, tl = sampler_mod.prompt_logprobs(raw, jnp.maximum(tokens, 0).reshape(-1),
                                                   num_logprobs)
    return VerifyOutput(tokens, n_acc + 1, lp.reshape(R, K1), rank.reshape(R, K1),
                        ti.reshape(R, K1, -1), tl.reshape(R, K1, -1))


verify_jit = jax.jit(verify, static_argnames=("num_logprobs",))
