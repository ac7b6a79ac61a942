"""A draft model proposing k tokens per decode row (same tokenizer as the target).

Its KV lives in its own pool, sized by its own layer shapes but with the
target's page count and page size, so it uses the very page ids of the
target's page tables: one page accounting (the scheduler's) covers both, and
freeing or rolling back a page frees it for both. Each engine step
(:meth:`DraftModel.run`, before the target's step):

1. copy-on-write page copies are applied to the draft's pool too;
2. *mirror*: every scheduled row's known tokens go through the draft (prompt
   chunks too), so its KV follows the target's. A row also re-feeds the
   tokens the draft has not seen (after all k proposals were accepted, the
   last proposal was never fed to the draft);
3. rows with proposal slots sample their first proposal from the mirror's
   logits, then k-1 single-token draft steps sample the rest.

The proposals are drawn from the draft's sampling distribution q under the
row's own sampling parameters (temperature, top-k/top-p, ...; greedy rows are
one-hot), with the seeded stream ``fold_in(key, c + j)`` tagged
``rejection.DRAFT_TAG``. The q rows stay on the device for the verification.
After verification the draft's KV is valid up to the target's rolled-back
``num_computed_tokens`` (accepted proposals were fed with the same tokens);
the rest is overwritten later, like the target's.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.kernels_pallas import copy_pages
from pagedjax.sample import sampler as sampler_mod
from pagedjax.worker.inputs import SampleRow, pow2, prepare_explicit
from pagedjax.worker.packing import pack, unpack
from pagedjax.core.scheduler import ScheduledRow
from pagedjax.spec_decode import rejection


class DraftModel:
    def __init__(self, model, params, kv_caches, *, k: int, buckets, plan, vocab_size: int,
                 max_model_len: int, scheduler):
        self.model = model
        self.params = params
        self.kv_caches = kv_caches
        self.k = k
        self.buckets = buckets
        self.plan = plan
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.scheduler = scheduler
        self.computed: dict[str, int] = {}  # seq id -> positions whose draft K/V is written
        self._q_rows: dict[int, int] = {}  # scheduled row index -> its row in q
        self._step = jax.jit(self._step_impl, static_argnames=("spec", "sspec", "plan"),
                             donate_argnums=(1,))
        self._copy = jax.jit(self._copy_impl, donate_argnums=(0,))
        self.num_steps = 0

    @classmethod
    def load(cls, spec, args, config, runner, info, scheduler) -> "DraftModel":
        import pagedjax.models as models

        try:
            model, params = models.load_model(spec.model, dtype=args.dtype)
        except (FileNotFoundError, ValueError, KeyError) as e:
            raise ValueError(f"speculative_config['model']={spec.model!r} could not be loaded "
                             f"as a draft model: {e}") from e
        if model.info.vocab_size != info.vocab_size:
            raise ValueError(
                f"the draft model {spec.model!r} has a vocabulary of {model.info.vocab_size} "
                f"tokens but the target has {info.vocab_size}; a draft model must share the "
                "target's tokenizer (same vocabulary size)")
        pool_dtype = None if args.kv_cache_dtype == "auto" else config.kv_cache_dtype
        kv = model.allocate_kv_caches(config.num_pages, args.page_size, pool_dtype)
        return cls(model, params, kv, k=spec.num_speculative_tokens, buckets=runner.buckets,
                   plan=runner.plan, vocab_size=info.vocab_size,
                   max_model_len=config.max_model_len, scheduler=scheduler)

    # ------------------------------------------------------------------ device
    def _step_impl(self, params, kv_caches, bufs, sbufs, *, spec, sspec, plan):
        batch = unpack(bufs, spec)
        st, sample_index = unpack(sbufs, sspec)
        hidden, kv_caches = self.model.forward(params, kv_caches, batch.token_ids, batch.meta,
                                               plan)
        logits = self.model.compute_logits(params, hidden[batch.logits_index], plan)
        probs = sampler_mod.sampling_probs(logits[sample_index], st)
        u = rejection.uniforms(st.key_data, st.counter, rejection.DRAFT_TAG)
        return rejection.draw(probs, u), probs, kv_caches

    @staticmethod
    def _copy_impl(kv_caches, src, dst):
        return tuple(copy_pages(pages, scales, src, dst) for pages, scales in kv_caches)

    def _launch(self, rows: list[ScheduledRow], states: list):
        """One draft step over ``rows``; samples the rows listed in ``states``
        ((row index, RowState)). Returns (tokens device i32[R], probs f32[R, V])."""
        srows = [SampleRow(rows[i].request_id, i, st, None) for i, st in states]
        batch, st, sample_index, _, _, _ = prepare_explicit(
            self.buckets, rows, srows, {}, None, None, self.vocab_size, self.max_model_len)
        bufs, spec = pack(batch)
        sbufs, sspec = pack((st, sample_index))
        tok, probs, self.kv_caches = self._step(self.params, self.kv_caches, bufs, sbufs,
                                                spec=spec, sspec=sspec, plan=self.plan)
        self.num_steps += 1
        return tok, probs

    # ------------------------------------------------------------------ host
    def q_row(self, row_index: int) -> int:
        return self._q_rows[row_index]

    def run(self, sched, sample_rows: Sequence[SampleRow]):
        """Mirror the step into the draft's KV and fill the rows' proposal slots.
        Returns q f32[Rq, K, V] on the device (None when nothing was proposed)."""
        if sched.page_copies:
            n = pow2(len(sched.page_copies), 8)
            src, dst = np.zeros(n, np.int32), np.zeros(n, np.int32)
            for i, (a, b) in enumerate(sched.page_copies):
                src[i], dst[i] = a, b
            self.kv_caches = self._copy(self.kv_caches, jnp.asarray(src), jnp.asarray(dst))
        first_state = {}
        for sr in sample_rows:
            first_state.setdefault(sr.row_index, sr.state)
        if len(self.computed) > 2 * len(self.scheduler.requests) + 64:  # forget finished ones
            self.computed = {sid: n for sid, n in self.computed.items()
                             if self.scheduler.get_request(sid) is not None}
        mirror, spec_idx = self._mirror_rows(sched.rows)
        cap = self.buckets.t_buckets()[-1]
        if sum(len(r.token_ids) for r in mirror) > cap:  # re-fed tokens overflow: feed them first
            lag = [dataclasses.replace(m, token_ids=m.token_ids[:len(m.token_ids) - len(r.token_ids)
                                                                + r.num_spec], num_samples=0)
                   for m, r in zip(mirror, sched.rows) if m.start_pos < r.start_pos]
            self._launch(lag, [])
            mirror = [dataclasses.replace(m, token_ids=r.token_ids[:len(r.token_ids) - r.num_spec],
                                          start_pos=r.start_pos) for m, r in zip(mirror, sched.rows)]
        self._q_rows = {i: m for m, i in enumerate(spec_idx)}
        states = [(i, first_state[i]) for i in spec_idx]
        tok, probs = self._launch(mirror, states)
        if not spec_idx:
            return None
        n_spec = [sched.rows[i].num_spec for i in spec_idx]
        drafts = np.zeros((len(spec_idx), self.k), np.int64)
        cols = [[probs[:len(spec_idx)]]]  # q for proposal 0 of every spec row
        drafts[:, 0] = np.asarray(tok)[:len(spec_idx)]
        for j in range(1, max(n_spec)):
            live = [m for m, n in enumerate(n_spec) if n > j]
            rows = [ScheduledRow(sched.rows[spec_idx[m]].request_id, [int(drafts[m, j - 1])],
                                 sched.rows[spec_idx[m]].start_pos + j,
                                 sched.rows[spec_idx[m]].page_ids, 1) for m in live]
            st = [(r, dataclasses.replace(first_state[spec_idx[m]],
                                          num_placeholders=first_state[spec_idx[m]].num_placeholders + j))
                  for r, m in enumerate(live)]
            tok, probs = self._launch(rows, st)
            drafts[live, j] = np.asarray(tok)[:len(live)]
            where = np.zeros(len(spec_idx), np.int32)
            where[live] = np.arange(len(live))
            cols.append([probs[jnp.asarray(where)]])
        for m, i in enumerate(spec_idx):
            row = sched.rows[i]
            n = row.num_spec
            row.token_ids[-n:] = [int(t) for t in drafts[m, :n]]
            self.computed[row.request_id] = row.start_pos + n  # last token + n - 1 proposals fed
        q = jnp.stack([c[0] for c in cols] + [cols[0][0]] * (self.k - len(cols)), axis=1)
        rq = pow2(len(spec_idx), 8)
        return jnp.pad(q, ((0, rq - q.shape[0]), (0, 0), (0, 0)))

    def _mirror_rows(self, rows: Sequence[ScheduledRow]):
        """The step's rows with their known tokens (plus any the draft has not seen);
        and the indices of rows with proposal slots."""
        out, spec_idx = [], []
        for i, row in enumerate(rows):
            n_known = len(row.token_ids) - row.num_spec
            start = min(self.computed.get(row.request_id, row.start_pos), row.start_pos)
            lag = []
            if start < row.start_pos:
                req = self.scheduler.get_request(row.request_id)
                lag = req.get_token_ids(start, row.start_pos) if req is not None else []
                if len(lag) != row.start_pos - start or min(lag, default=0) < 0:
                    lag, start = [], row.start_pos
            out.append(ScheduledRow(row.request_id, lag + row.token_ids[:n_known], start,
                                    row.page_ids, 1 if row.num_spec else 0))
            self.computed[row.request_id] = row.start_pos + n_known
            if row.num_spec:
                spec_idx.append(i)
        return out, spec_idx

    def forget(self, seq_ids) -> None:
        for sid in seq_ids:
            self.computed.pop(sid, None)
