"""EngineCore: schedule -> execute -> update, with the next step overlapping the device.

The core owns the scheduler and the runner and knows nothing about text. One
:meth:`EngineCore.step`:

1. ``Scheduler.schedule()`` for step N (rows whose previous token is still on
   the device get a placeholder, see ``request.py``);
2. ``Runner.launch`` dispatches step N without waiting (its placeholders read
   step N-1's sampled tokens on the device);
3. while the device runs step N, the host fetches step N-1's results,
   ``Scheduler.update()``s them and turns them into plain per-sequence
   :class:`~pagedjax.engine.output_processor.SeqUpdate` s, which it returns.

With ``async_scheduling=False`` (or while a request needs its full token
history on the host before each step: repetition penalties, multi-token bad
words, beam search) step N is fetched before the call returns, which is the
serial engine. A structured-output row's mask for step N needs step N-1's
token: such a step launches its model first, then fetches step N-1 (the
matchers advance), then launches its sampler with the masks. Both orders give the same tokens: sampling depends on each
row's seed and position, never on the step it runs in.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from typing import Any, Sequence

from pagedjax.engine.core_output import CoreOutput, SeqUpdate
from pagedjax.core.request import Request
from pagedjax.worker.runner import Launched, Runner
from pagedjax.engine.sequences import PARAMS_SEED_MODULUS, RequestSampling, Sequences
from pagedjax.core.scheduler import Scheduler, SchedulerOutput

logger = logging.getLogger("pagedjax.engine.core")

_request_id = operator.attrgetter("request_id")
_num_samples = operator.attrgetter("num_samples")
_finish_reason = operator.attrgetter("finish_reason")


@dataclasses.dataclass
class _StepPlan:
    """What the core tells the runner about a step's rows beyond the scheduler's
    output. The sampling rows: each sampling row's first sample (``first_ids``:
    their sequences, in row order), then n > 1 forks' other samples."""

    first_ids: list[str]
    forks: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (row, sample index)
    extra_targets: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # (seq, index)
    grammar_bits: dict[int, Any] = dataclasses.field(default_factory=dict)  # sampling row -> mask
    deferred: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (sampling row, seq)
    prompt_lp: dict[str, int] = dataclasses.field(default_factory=dict)
    prompt_starts: dict[str, int] = dataclasses.field(default_factory=dict)
    pool_rows: set[str] = dataclasses.field(default_factory=set)  # prompt hidden states wanted


@dataclasses.dataclass
class _InFlight:
    sched: SchedulerOutput
    launched: Launched
    plan: _StepPlan


class EngineCore:
    """Scheduler + runner; sequences in, token deltas out."""

    def __init__(self, scheduler: Scheduler, runner: Runner, eos_token_ids: Sequence[int],
                 async_scheduling: bool = True, speculator: Any = None,
                 encoder_cache: Any = None):
        self.scheduler = scheduler
        # Vision-language models: the image encoder outputs (worker/encoder_cache.py).
        self.encoder_cache = encoder_cache
        self.runner = runner
        # Speculative decoding (spec_decode.Speculator): proposals before scheduling,
        # verification in the step; its steps run serially (accepted counts are
        # known only once fetched).
        self.speculator = speculator
        self.eos_token_ids = tuple(eos_token_ids)
        self.async_scheduling = async_scheduling
        runner.input_batch.eos_token_ids = self.eos_token_ids
        self.seqs = Sequences(runner.input_batch)  # per sequence and request (sequences.py)
        self._inflight: _InFlight | None = None
        # The rows of the steps being worked on (step_request_ids, after a failure).
        self._recent: list[list] = []
        self.num_steps = 0
        self.num_overlapped_steps = 0
        if runner.mrope_of is not None:  # M-RoPE: each request's positions (worker/mrope.py)
            requests = scheduler.requests
            runner.mrope_of = lambda sid: getattr(requests.get(sid), "mrope", None)

    # ------------------------------------------------------------------ requests
    def add_request(self, req: Request, fallback_seed: int, bad_words_ids: list,
                    keep_topk: bool = False, grammar: Any = None) -> None:
        """Queue a request (raises ValueError from the scheduler's checks).
        ``grammar``: a structured_outputs.GrammarState constraining its sequences."""
        p = req.sampling_params
        params = [p]
        for i in range(1, p.n):
            q = p
            if p.seed is not None:
                q = p.clone()
                q.seed = (p.seed + i) % PARAMS_SEED_MODULUS
            params.append(q)
        history = bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0
                       or any(len(w) > 1 for w in bad_words_ids))
        self.scheduler.add_request(req)
        s = RequestSampling(params, fallback_seed, bad_words_ids, p.prompt_logprobs, history,
                            keep_topk, set(), grammar, pool=p.prompt_hidden_states)
        self.seqs.add(req, s)

    def finish_sequences(self, seq_ids: Sequence[str], reason: str = "abort",
                         stop_reason: Any = None) -> None:
        """Finish sequences now (abort, or 'stop' for a stop string); pages freed at once."""
        for sid in seq_ids:
            self.scheduler.finish_request(sid, reason, stop_reason)
            self.seqs.forget(sid)
            if self.encoder_cache is not None:  # its images' encoder rows are free now
                self.encoder_cache.release(sid)

    def abort_request(self, request_id: str) -> None:
        """Abort a request and all of its sequences."""
        for sid in self.seqs.seq_ids(request_id):
            self.scheduler.abort_request(sid)
            self.seqs.forget(sid)
            if self.encoder_cache is not None:  # its images' encoder rows are free now
                self.encoder_cache.release(sid)

    def step_request_ids(self) -> list[str]:
        """Requests with a row in the latest launched step or the one in flight
        (the requests a failing ``step()`` was working on). Worked out only when
        asked: a step does not pay for it."""
        ids: dict[str, None] = {}
        for rows in self._recent:
            for r in rows:
                rid = self.seqs.request_of(r.request_id)
                if rid is not None:
                    ids[rid] = None
        return list(ids)

    # ------------------------------------------------------------------ beams (public)
    def fork_sequence(self, seq_id: str, new_seq_id: str) -> None:
        """A new sequence sharing ``seq_id``'s tokens and pages (copy-on-write)."""
        self._drain_check()
        child = self.scheduler.fork_request(seq_id, new_seq_id)
        self.seqs.join(new_seq_id, *self.seqs.root(seq_id), child)

    def replace_pending_token(self, seq_id: str, token_id: int) -> None:
        """Swap the newest (sampled, not yet computed) token of a sequence."""
        self._drain_check()
        req = self.scheduler.get_request(seq_id)
        if req is None or not req.output_token_ids:
            raise ValueError(f"sequence {seq_id!r} has no pending token to replace")
        req.output_token_ids[-1] = int(token_id)

    def take_top_logprobs(self, seq_id: str) -> dict[int, float] | None:
        """The top-k logprobs of a keep_topk sequence's newest step (once), else None."""
        return self.seqs.topk.pop(seq_id, None)

    def is_finished(self, seq_id: str) -> bool:
        return self.scheduler.get_request(seq_id) is None

    def _drain_check(self) -> None:
        if self._inflight is not None:
            raise RuntimeError("beam search edits need the serial engine: no step in flight")

    # ------------------------------------------------------------------ step
    def _serial(self) -> bool:
        return not self.async_scheduling or self.seqs.num_serial > 0 or self.speculator is not None

    def _may_speculate(self, req: Request) -> bool:
        ref = self.seqs.root(req.request_id)
        return ref is not None and not self.seqs.sampling[ref[0]].token_by_token

    def step(self) -> CoreOutput:
        """Schedule and launch the next step; return the results of the one before
        (or of this one when running serially)."""
        out = CoreOutput()
        self.seqs.begin_step()
        self._recent = [self._inflight.sched.rows] if self._inflight is not None else []
        if self._inflight is not None and self._serial():
            self._complete(self._take_inflight(), out)
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self._may_speculate)
        sched = self.scheduler.schedule()
        self._recent.append(sched.rows)
        launched = self._launch(sched, out) if sched.rows else None
        if launched is not None and self._inflight is not None:
            self.num_overlapped_steps += 1  # launched while the one before was in flight
        if self._inflight is not None:
            self._complete(self._take_inflight(), out)
        if launched is not None and launched.plan.deferred:
            self._sample_deferred(launched)
        self._inflight = launched
        if launched is not None and self._serial():
            self._complete(self._take_inflight(), out)
        return out

    def _take_inflight(self) -> _InFlight:
        """The step in flight, forgotten first: if fetching it fails, the engine can
        fail its requests and carry on instead of failing on it again."""
        fl, self._inflight = self._inflight, None
        return fl

    def _grammar_bits(self, s: RequestSampling, req: Request, sid: str, fork: bool):
        """A grammar row's mask; a row whose previous token is still on the device
        gets its mask later (_sample_deferred): until then every token is open."""
        if not fork and req.num_pending > 1:
            return s.grammar.open_mask
        return s.grammar.mask(sid, [] if fork else req.output_token_ids, fork)

    def _launch(self, sched: SchedulerOutput, out: CoreOutput) -> _InFlight:
        self.runner.copy_pages(sched.page_copies)
        rows = sched.rows
        ids = list(map(_request_id, rows))
        if self.seqs.steady.issuperset(ids) and sum(map(_num_samples, rows)) == len(rows):
            plan = _StepPlan(ids)  # every row the common one: nothing to do per row
        else:
            plan = self._plan_rows(rows, out)
        prev = self._inflight
        mm = self._mm_inputs(rows) if self.encoder_cache is not None else None
        if self.speculator is not None:  # serial: nothing in flight
            launched = self.speculator.launch(sched, plan.forks, plan.grammar_bits,
                                              plan.prompt_lp)
        else:
            launched = self.runner.launch(rows, forks=plan.forks, grammar_bits=plan.grammar_bits,
                                          prompt_lp=plan.prompt_lp,
                                          prev=prev.launched if prev else None,
                                          defer_sample=bool(plan.deferred), mm=mm,
                                          pool_rows=plan.pool_rows or None)
        self.num_steps += 1
        return _InFlight(sched, launched, plan)

    def _plan_rows(self, rows, out: CoreOutput) -> "_StepPlan":
        """A step's sampling rows, what to report to the output processor, and the
        rows wanting prompt logprobs, hidden states or a grammar mask."""
        now = time.time()
        plan = _StepPlan([])
        first_ids, seqs = plan.first_ids, self.seqs
        get_request, sampling, steady = self.scheduler.requests.get, seqs.sampling, seqs.steady
        first_scheduled, cached = out.first_scheduled, out.num_cached_tokens
        fork_grammar: list = []
        for i, row in enumerate(rows):
            sid = row.request_id
            if row.num_samples == 1 and sid in steady:
                first_ids.append(sid)  # the common row
                continue
            req = get_request(sid)
            rid, idx = seqs.root(sid)
            s = sampling[rid]
            if not s.reported_scheduled:  # told once: the processor keeps the first time
                s.reported_scheduled = True
                first_scheduled[rid] = now
            if s.reported_cached < req.num_cached_tokens:
                s.reported_cached = cached[rid] = req.num_cached_tokens
            if row.start_pos < req.num_prompt_tokens:
                if s.prompt_logprobs is not None:
                    plan.prompt_lp[sid] = s.prompt_logprobs
                    plan.prompt_starts[sid] = row.start_pos
                if s.pool is not None:
                    plan.pool_rows.add(sid)
                    plan.prompt_starts[sid] = row.start_pos
            if row.num_samples == 0:
                continue
            fork = row.num_samples > 1
            # Each row's first sample comes first, so a row's index in this step's
            # sampled tokens is < max_num_seqs (the next step's placeholder source).
            j = len(first_ids)
            first_ids.append(sid)
            if s.grammar is not None:
                plan.grammar_bits[j] = self._grammar_bits(s, req, sid, fork)
                if not fork and req.num_pending > 1:
                    plan.deferred.append((j, sid))
            elif not fork:
                # Reported above: its later rows take the short path. (A prompt chunk
                # they skip after a preemption has its prompt logprobs already.)
                steady.add(sid)
            if fork:
                for k in range(1, row.num_samples):
                    plan.forks.append((i, k))
                    plan.extra_targets.append((sid, k))
                    fork_grammar.append(plan.grammar_bits.get(j))
        for m, bits in enumerate(fork_grammar, len(first_ids)):
            if bits is not None:
                plan.grammar_bits[m] = bits
        return plan

    def _mm_inputs(self, rows) -> tuple | None:
        """The step's image inputs (encoding images the cache lacks); then releases
        the requests whose image tokens are all computed, and those that left."""
        from pagedjax.worker.mm_inputs import step_pieces

        cache, requests = self.encoder_cache, self.scheduler.requests
        mm = step_pieces(rows, lambda sid: requests[sid].mm_items, cache)
        for row in rows:
            items = requests[row.request_id].mm_items
            if items and row.start_pos + len(row.token_ids) >= items[-1].end:
                cache.release(row.request_id)
        for sid in cache.holder_ids():
            if sid not in requests:
                cache.release(sid)
        return mm

    def _sample_deferred(self, fl: _InFlight) -> None:
        """The step before is fetched and its tokens fed to the matchers: launch this
        step's sampler with the grammar rows' masks (rows of sequences that ended
        meanwhile keep an open mask; their tokens are ignored)."""
        bits = dict(fl.plan.grammar_bits)
        for j, sid in fl.plan.deferred:
            req = self.scheduler.get_request(sid)
            ref = self.seqs.root(sid)
            if req is not None and ref is not None:
                bits[j] = self._grammar_bits(self.seqs.sampling[ref[0]], req, sid, False)
        fl.launched = self.runner.launch_sample(fl.launched, bits)
        fl.plan.deferred = []

    def _complete(self, fl: _InFlight, out: CoreOutput) -> None:
        if isinstance(fl.launched, Launched):
            res = self.runner.fetch(fl.launched)
            ids = res.token_ids[:len(fl.plan.first_ids) + len(fl.plan.extra_targets)].tolist()
            tokens = None
            spec = None
        else:  # a speculative step: each row emits its accepted tokens + 1
            res = self.speculator.fetch(fl.launched)
            tokens = res.tokens
            ids = None
            spec = {r.request_id: (r.num_spec, self.scheduler.get_request(r.request_id))
                    for r in fl.sched.rows if r.num_spec}
            spec = {sid: (n, req, req.num_output_tokens) for sid, (n, req) in spec.items()
                    if req is not None}
        first_ids = fl.plan.first_ids  # the sequences of the first sampling rows, in order
        if tokens is None:  # one token per row, as a bare int
            sampled = dict(zip(first_ids, ids))
        else:
            sampled = {sid: list(tokens[j]) for j, sid in enumerate(first_ids)}
        extra_of: dict[tuple[str, int], int] = {}  # (parent seq id, sample index) -> row
        for j, (sid, idx) in enumerate(fl.plan.extra_targets, len(first_ids)):
            extra_of[(sid, idx)] = j
            got = sampled[sid]
            if got.__class__ is int:
                sampled[sid] = got = [got]
            got.extend(tokens[j] if tokens is not None else (ids[j],))
        for sid, arrays in res.prompt_logprobs.items():
            ref = self.seqs.root(sid)
            if ref is not None:
                out.prompt_logprobs[ref[0]] = (fl.plan.prompt_starts[sid],) + tuple(arrays)
        for sid, hidden in getattr(res, "prompt_hidden", {}).items():  # (none when speculating)
            ref = self.seqs.root(sid)
            if ref is not None:
                out.prompt_hidden[ref[0]] = (fl.plan.prompt_starts[sid], hidden)
        changed = self.scheduler.update(fl.sched, sampled)
        # n > 1 children forked by this update join their request first: the parent
        # may finish on this very token (and be forgotten) while they go on.
        if extra_of:
            for req in changed:
                parent = self.seqs.root(req.parent_id) if req.parent_id is not None else None
                if (req.request_id not in sampled and parent is not None
                        and (req.parent_id, req.sample_index) in extra_of):
                    self.seqs.join(req.request_id, parent[0], req.sample_index, req)
        token_only = self.seqs.token_only
        if (spec is None and not extra_of and token_only.issuperset(first_ids)
                and not any(map(_finish_reason, changed))
                and list(map(_request_id, changed)) == first_ids):
            # Every row the common one, in order (C-level checks): two columns, no SeqUpdate.
            out.token_request_ids.extend(first_ids)
            out.token_ids.extend(ids)
            return
        logprob = rank = None  # as lists, made when a row needs a SeqUpdate
        sampling = self.seqs.sampling
        token_ids_out, tokens_out = out.token_request_ids, out.token_ids
        first_of = None  # seq id -> its first sampling row, made when a row needs it
        for req in changed:
            sid = req.request_id
            if sid in token_only and spec is None and req.finish_reason is None \
                    and sid in sampled:
                token_ids_out.append(sid)  # the common row: two columns, no SeqUpdate
                tokens_out.append(sampled[sid])
                continue
            if first_of is None:
                first_of = {s: j for j, s in enumerate(first_ids)}
            j = first_of.get(sid)
            if j is None:
                j = extra_of.get((req.parent_id, req.sample_index))
            root = self.seqs.root(sid)
            if j is None or root is None:
                if root is not None and req.prefill_only and req.is_finished:
                    # a pooling request, done after its prompt: no token, no sampler row
                    out.updates.append(SeqUpdate(sid, root[0], root[1], [],
                                                 finish_reason=req.finish_reason))
                    self.seqs.forget(sid)
                continue
            rid, idx = root
            s = sampling.get(rid)
            if s is not None and s.grammar is not None and not req.is_finished and \
                    self._advance_grammar(s.grammar, req) == "conflict":
                # sampled from an empty mask: not a token of the request's; only its end
                out.updates.append(SeqUpdate(sid, rid, idx, [], finish_reason=req.finish_reason,
                                             stop_reason=req.stop_reason))
                self.seqs.forget(sid)
                continue
            if spec is not None:
                self._spec_updates(req, rid, idx, j, tokens[j], res, spec, out)
                continue
            wants_lp = s is not None and s.params[0].logprobs is not None
            if logprob is None:
                logprob, rank = res.logprob.tolist(), res.rank.tolist()
            up = SeqUpdate(sid, rid, idx, [ids[j]], logprob[j], rank[j],
                           res.topk_ids[j] if wants_lp else (),
                           res.topk_logprobs[j] if wants_lp else (),
                           req.finish_reason, req.stop_reason)
            if s is not None and s.keep_topk:
                k = s.params[0].logprobs
                self.seqs.topk[sid] = {int(t): float(v) for t, v in
                                   zip(res.topk_ids[j][:k], res.topk_logprobs[j][:k])}
            out.updates.append(up)
            if req.finish_reason is not None:
                self.seqs.forget(sid)

    def _advance_grammar(self, grammar: Any, req: Request) -> str | None:
        """Feed a constrained sequence's new token to its matcher; a complete grammar
        finishes the sequence now ('stop'), a broken one ends it with 'error' (the
        matcher's message as its stop_reason), and so does one whose allowed_token_ids
        and grammar met no common token ('conflict' returned: its token is dropped)."""
        state = grammar.advance(req.request_id, req.output_token_ids)
        if state == "done":
            self.scheduler.finish_request(req.request_id, "stop")
        elif state == "conflict":
            self.scheduler.finish_request(req.request_id, "error",
                                          grammar.error(req.request_id))
        elif state == "error":
            why = grammar.error(req.request_id) or "the grammar matcher failed"
            logger.warning("structured output of %s failed: %s", req.request_id, why)
            self.scheduler.finish_request(req.request_id, "error",
                                          f"structured output failed: {why}")
        return state

    def _spec_updates(self, req: Request, rid: str, idx: int, j: int, tokens: list[int], res,
                      spec: dict, out: CoreOutput) -> None:
        """One SeqUpdate per token the scheduler kept of a verified row (EOS, stop
        tokens and length limits may drop the later ones); the finish reason and the
        row's proposal counts ride on the last / first one."""
        num_draft, _, before = spec.get(req.request_id, (0, None, req.num_output_tokens - 1))
        kept = req.num_output_tokens - before
        if num_draft:
            self.speculator.record(num_draft, len(tokens) - 1)
        for t in range(kept):
            last = t == kept - 1
            out.updates.append(SeqUpdate(
                req.request_id, rid, idx, [int(tokens[t])], float(res.logprob[j, t]),
                int(res.rank[j, t]), res.topk_ids[j, t], res.topk_logprobs[j, t],
                req.finish_reason if last else None, req.stop_reason if last else None,
                num_draft_tokens=num_draft if t == 0 else 0,
                num_accepted_tokens=len(tokens) - 1 if t == 0 and num_draft else 0))
        s = self.seqs.sampling.get(rid)
        if s is not None and s.keep_topk and kept:
            k = s.params[0].logprobs
            self.seqs.topk[req.request_id] = {int(t): float(v) for t, v in
                                          zip(res.topk_ids[j, 0][:k], res.topk_logprobs[j, 0][:k])}
        if req.is_finished:
            self.seqs.forget(req.request_id)
