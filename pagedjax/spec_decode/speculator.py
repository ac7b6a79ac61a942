"""The engine's speculative decoding: propose before scheduling, verify in the step.

One serial engine step with a :class:`Speculator` (``EngineCore`` calls it):

1. :meth:`propose` (before ``Scheduler.schedule``): every running request in
   decode (its last token known, nothing in flight) gets up to k proposed
   tokens in ``Request.spec_token_ids``: the n-gram proposals, or k
   placeholders that the draft model fills after scheduling. k shrinks so the
   accepted tokens plus the bonus token never pass ``max_tokens`` or the length
   cap. Requests that need their full history per token (penalties,
   multi-token bad words, beam search) get none.
2. The scheduler feeds each such row its last token plus the proposals (pages
   allocated for all of them; ``ScheduledRow.num_spec``).
3. :meth:`launch`: the draft model (if any) mirrors the step's tokens into its
   own KV pages and fills the proposals; the target runs the whole batch once
   (``Runner.launch_logits``: logits at every proposal position), and
   ``rejection.verify`` accepts/rejects on the device. A step without
   proposals samples as usual (``Runner.launch``).
4. :meth:`fetch`: per sampling row the emitted tokens (accepted + 1) and their
   logprobs; ``Scheduler.update`` rolls back the rejected positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.sample import sampler as sampler_mod
from pagedjax.worker.inputs import SampleRow, logprob_bucket, pow2
from pagedjax.worker.packing import pack, unpack
from pagedjax.core.request import Request
from pagedjax.sample.sampler import RowState
from pagedjax.spec_decode import rejection
from pagedjax.spec_decode.config import SpeculativeConfig
from pagedjax.spec_decode.ngram import NgramProposer


@dataclasses.dataclass
class SpecLaunched:
    """A dispatched verification step (device results not fetched yet)."""

    out: Any  # rejection.VerifyOutput of device arrays
    plp: Any  # prompt logprob arrays or None
    cu_q_lens: np.ndarray
    row_ids: list[str]
    prompt_lp: dict[str, int]
    num_rows: int  # real sampling rows


@dataclasses.dataclass
class SpecResult:
    """Fetched: emitted tokens per sampling row; logprob arrays [R, K+1(, k)]."""

    tokens: list[list[int]]
    logprob: np.ndarray
    rank: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    prompt_logprobs: dict[str, tuple[np.ndarray, ...]]


class Speculator:
    """Proposer + verifier for an engine (see the module docstring)."""

    def __init__(self, config: SpeculativeConfig, runner, max_seq_len: int, draft=None):
        self.config = config
        self.k = config.num_speculative_tokens
        self.runner = runner
        self.max_seq_len = max_seq_len
        self.draft = draft  # DraftModel or None (n-gram)
        self.ngram = (NgramProposer(self.k, config.prompt_lookup_max, config.prompt_lookup_min)
                      if config.method == "ngram" else None)
        self._verify = jax.jit(self._verify_impl, static_argnames=("spec", "num_logprobs"))
        # Totals since start (the engine's public stats).
        self.num_drafts = 0  # rows verified with at least one proposal
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    # ------------------------------------------------------------------ propose
    def budget(self, req: Request) -> int:
        """Proposals allowed so that accepted + bonus stay within the limits."""
        cap = min(req.max_model_len or self.max_seq_len, self.max_seq_len)
        k = min(self.k, cap - req.num_tokens - 1)
        if req.max_tokens is not None:
            k = min(k, req.max_tokens - req.num_output_tokens - 1)
        return max(0, k)

    def propose(self, running: Iterable[Request], may_speculate: Callable[[Request], bool]) -> None:
        for req in running:
            req.spec_token_ids = []
            if (req.num_pending or req.num_output_tokens == 0
                    or req.num_computed_tokens != req.num_tokens - 1 or not may_speculate(req)):
                continue
            k = self.budget(req)
            if k <= 0:
                continue
            if self.ngram is not None:
                req.spec_token_ids = self.ngram.propose(req.all_token_ids, k)
            else:
                req.spec_token_ids = [-1] * k  # the draft model fills them after scheduling

    # ------------------------------------------------------------------ launch
    def launch(self, sched, forks: Sequence[tuple[int, int]], grammar_bits: dict[int, Any],
               prompt_lp: dict[str, int]):
        """Run the step: ordinary sampling when nothing was proposed, else verification.
        ``forks`` and ``grammar_bits``: as ``Runner.launch`` takes them. (A draft model
        proposes without LoRA adapters; the target verifies with them.)"""
        sample_rows = self.runner.input_batch.sample_rows(sched.rows, forks, grammar_bits)
        q = None
        if self.draft is not None:
            q = self.draft.run(sched, sample_rows)  # fills the rows' proposal tokens
        spec_rows = [sr for sr in sample_rows if sched.rows[sr.row_index].num_spec]
        if not spec_rows:
            return self.runner.launch(sched.rows, forks=forks, grammar_bits=grammar_bits,
                                      prompt_lp=prompt_lp)
        logits, plp, cu, s = self.runner.launch_logits(sched.rows, prompt_lp)
        vi, num_logprobs = self._verify_inputs(sched.rows, sample_rows, s)
        bufs, spec = pack(vi)
        out = self._verify(logits, jax.device_put(bufs), q, spec=spec, num_logprobs=num_logprobs)
        return SpecLaunched(out, plp, cu, [r.request_id for r in sched.rows], prompt_lp,
                            len(sample_rows))

    @staticmethod
    def _verify_impl(logits, bufs, q, *, spec, num_logprobs):
        return rejection.verify(logits, unpack(bufs, spec), q, num_logprobs)

    def _verify_inputs(self, rows, sample_rows: Sequence[SampleRow], s: int):
        """VerifyInputs for the sampling rows (padded to a power of two >= 8)."""
        K, K1 = self.k, self.k + 1
        R = pow2(max(len(sample_rows), 1), 8)
        logit_rows = np.zeros((R, K1), np.int32)
        draft_ids = np.zeros((R, K), np.int32)
        num_draft = np.zeros(R, np.int32)
        q_row = np.full(R, -1, np.int32)
        states: list[RowState] = []
        extra = s  # the proposal positions' logits rows follow the S last-token rows
        offsets = {}
        for i, row in enumerate(rows):
            offsets[i] = extra
            extra += row.num_spec
        seen: set[int] = set()
        for j, sr in enumerate(sample_rows):
            row = rows[sr.row_index]
            n = row.num_spec if sr.row_index not in seen else 0  # forks: none
            seen.add(sr.row_index)
            logit_rows[j, :] = sr.row_index
            logit_rows[j, :n] = offsets[sr.row_index] + np.arange(n)
            num_draft[j] = n
            if n:
                draft_ids[j, :n] = row.token_ids[-n:]
                if self.draft is not None:
                    q_row[j] = self.draft.q_row(sr.row_index)
            base = sr.state
            for t in range(K1):
                states.append(dataclasses.replace(base, num_placeholders=base.num_placeholders + t))
        st = sampler_mod.build_sampling_tensors(states, R * K1, self.runner.vocab_size,
                                                self.runner.max_model_len)
        wanted = [sr.num_logprobs for sr in sample_rows if sr.num_logprobs is not None]
        num_logprobs = logprob_bucket(max(wanted)) if wanted else None
        vi = rejection.VerifyInputs(logit_rows, draft_ids, num_draft, q_row, st)
        return vi, num_logprobs

    # ------------------------------------------------------------------ fetch
    def fetch(self, launched: SpecLaunched) -> SpecResult:
        out, plp = jax.device_get((launched.out, launched.plp))
        n = launched.num_rows
        tokens = [list(map(int, out.tokens[j, :int(out.num_out[j])])) for j in range(n)]
        prompt_out = {}
        if plp is not None:
            cu = launched.cu_q_lens
            for i, rid in enumerate(launched.row_ids):
                if rid in launched.prompt_lp:
                    a, b = int(cu[i]), int(cu[i + 1])
                    prompt_out[rid] = tuple(np.asarray(x)[a:b] for x in plp)
        return SpecResult(tokens, np.asarray(out.logprob), np.asarray(out.rank),
                          np.asarray(out.topk_ids), np.asarray(out.topk_logprobs), prompt_out)

    def record(self, num_draft: int, num_accepted: int) -> None:
        """Count one verified row (the engine's totals)."""
        if num_draft:
            self.num_drafts += 1
            self.num_draft_tokens += num_draft
            self.num_accepted_tokens += num_accepted


def make_speculator(args, config, runner, scheduler, info) -> Speculator:
    """The engine's Speculator from ``EngineArgs.speculative_config`` (validated)."""
    from pagedjax.spec_decode.config import parse_speculative_config

    spec = parse_speculative_config(args.speculative_config)
    if args.tensor_parallel_size > 1:
        raise ValueError("speculative_config is not supported with tensor_parallel_size > 1 "
                         "yet; drop one of them")
    draft = None
    if spec.method == "draft_model":
        from pagedjax.spec_decode.draft_model import DraftModel

        draft = DraftModel.load(spec, args, config, runner, info, scheduler)
    return Speculator(spec, runner, scheduler.max_seq_len, draft)
