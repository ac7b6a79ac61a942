"""OutputProcessor: the text side of the engine (no JAX, no scheduler).

The engine core hands over plain per-sequence results (:class:`SeqUpdate`:
new token ids, logprob arrays, finish reason, parent request and sample
index). This module turns them into vLLM's ``RequestOutput``: incremental
detokenization, stop strings, logprob dicts, metrics. A stop string it finds
is returned to the engine as a sequence to finish; the engine passes it to
the core after this step's processing, never from inside the core's update.

Logprob texts are decoded in one batched tokenizer call per step (with a
bounded cache), not one ``tokenizer.decode([id])`` per token.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

import numpy as np

from pagedjax.engine.byte_detokenizer import ByteDetokenizer, byte_table
from pagedjax.engine.core_output import CoreOutput, SeqUpdate
from pagedjax.engine.detokenizer import IncrementalDetokenizer, StopChecker, rust_backend
from pagedjax.outputs import CompletionOutput, RequestMetrics, RequestOutput, make_logprobs_dict
from pagedjax.sampling_params import RequestOutputKind, SamplingParams


@dataclasses.dataclass(slots=True)
class _Seq:
    index: int
    detok: Any
    stop: Any
    params: SamplingParams
    text: str = ""
    token_ids: list = dataclasses.field(default_factory=list)
    cumulative_logprob: float = 0.0
    logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: Any = None
    # output_kind=DELTA: how much of text / token_ids earlier outputs carried, and
    # whether one carried the finish.
    sent_text: int = 0
    sent_tokens: int = 0
    sent_final: bool = False


@dataclasses.dataclass(slots=True)
class _ReqState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: dict[int, _Seq]
    metrics: RequestMetrics
    prompt_logprobs: list | None = None
    num_cached_tokens: int = 0
    finished: bool = False
    num_finished_seqs: int = 0
    # The one sequence of a request that needs only text appended (n=1, no logprobs,
    # no stop strings, detokenized), which process() updates on a short path; None otherwise.
    text_only: _Seq | None = None
    hidden: dict | None = None  # first position -> hidden chunk (prompt_hidden_states)


class OutputProcessor:
    """Per-request text state; ``process(core_output)`` -> (outputs, sequences to stop)."""

    DECODE_CACHE = 1 << 16

    def __init__(self, tokenizer, max_finished_metrics: int = 4096):
        self.tokenizer = tokenizer
        self._states: dict[str, _ReqState] = {}
        self._decoded: dict[int, str] = {}
        self.finished_metrics: collections.deque = collections.deque(maxlen=max_finished_metrics)
        self.num_generated_tokens = 0
        self._wants_texts: set[str] = set()  # requests with logprob dicts (token texts)
        self._byte_tables: dict[bool, Any] = {}  # skip_special_tokens -> ByteTable | None

    def _detokenizer(self, prompt_token_ids: list[int], params: SamplingParams):
        """A byte-table detokenizer for byte-level BPE tokenizers (byte_detokenizer.py),
        else the general one; built once per skip_special_tokens setting."""
        skip = params.skip_special_tokens
        if skip not in self._byte_tables:
            self._byte_tables[skip] = byte_table(rust_backend(self.tokenizer), skip)
        table = self._byte_tables[skip]
        detok = ByteDetokenizer.create(table, prompt_token_ids) if table is not None else None
        return detok or IncrementalDetokenizer(
            self.tokenizer, prompt_token_ids, skip_special_tokens=skip,
            spaces_between_special_tokens=params.spaces_between_special_tokens)

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float) -> None:
        seqs = {}
        for i in range(params.n):
            seqs[i] = _Seq(
                index=i,
                detok=self._detokenizer(prompt_token_ids, params),
                stop=StopChecker(params.stop or [], params.include_stop_str_in_output),
                params=params, logprobs=[] if params.logprobs is not None else None)
        if params.logprobs is not None or params.prompt_logprobs is not None:
            self._wants_texts.add(request_id)
        text_only = params.n == 1 and params.logprobs is None and params.detokenize \
            and not seqs[0].stop.stop
        self._states[request_id] = _ReqState(
            request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids,
            params=params, seqs=seqs,
            metrics=RequestMetrics(arrival_time=arrival_time, last_token_time=arrival_time),
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
            text_only=seqs[0] if text_only else None)

    def abort(self, request_id: str) -> bool:
        self._wants_texts.discard(request_id)
        return self._states.pop(request_id, None) is not None

    def has(self, request_id: str) -> bool:
        return request_id in self._states

    def request_ids(self) -> list[str]:
        return list(self._states)

    def scheduled_request_ids(self) -> list[str]:
        return [rid for rid, st in self._states.items()
                if st.metrics.first_scheduled_time is not None]

    def __len__(self) -> int:
        return len(self._states)

    # ------------------------------------------------------------------ step
    def process(self, core: CoreOutput) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """Outputs of the requests that changed, and (sequence id, stop string) pairs
        whose sequences the core must finish."""
        now = time.time()
        for rid, t in core.first_scheduled.items():
            st = self._states.get(rid)
            if st is not None and st.metrics.first_scheduled_time is None:
                st.metrics.first_scheduled_time = t
                st.metrics.time_in_queue = t - st.metrics.arrival_time
        for rid, n in core.num_cached_tokens.items():
            st = self._states.get(rid)
            if st is not None:
                st.num_cached_tokens = max(st.num_cached_tokens, n)
        self._decode_all(core)
        for rid, chunk in core.prompt_logprobs.items():
            st = self._states.get(rid)
            if st is not None:
                self._add_prompt_logprobs(st, chunk)
        for rid, (start, hidden) in core.prompt_hidden.items():
            st = self._states.get(rid)
            if st is not None:
                if st.hidden is None:
                    st.hidden = {}
                if st.params.prompt_hidden_states == "last":  # only the last row matters
                    start, hidden = start + len(hidden) - 1, hidden[-1:]
                st.hidden[start] = hidden
        touched: dict[str, _ReqState] = {}
        stops: list[tuple[str, str]] = []
        outputs: list[RequestOutput] = []
        states = self._states
        num_tokens = 0
        cumulative = RequestOutputKind.CUMULATIVE
        for rid, tok in zip(core.token_request_ids, core.token_ids):
            st = states.get(rid)
            if st is None:
                continue
            seq = st.text_only
            if seq is None:  # stop strings, or not detokenized: the general path
                if self._update(st, SeqUpdate(rid, rid, 0, [tok]), now, stops):
                    touched[rid] = st
                continue
            # The common row, on a short path (runs per row per step): what _append
            # does for one token without stop strings or logprobs.
            m = st.metrics
            if m.first_token_time is None:
                m.first_token_time = now
            m.last_token_time = now
            seq.token_ids.append(tok)
            # The checker has no stop strings here: its add() would only append.
            seq.stop.text = seq.text = seq.text + seq.detok.add(tok)
            num_tokens += 1
            if st.params.output_kind is not cumulative:
                touched[rid] = st
                continue
            # _make_output for the one text-only sequence, inlined and made here, in the same
            # pass (per row per step; it never finishes here: finishing rows come as
            # SeqUpdates). The general path measured ~10% slower at 256 rows (host_overhead.py).
            outputs.append(RequestOutput(
                rid, st.prompt, st.prompt_token_ids, st.prompt_logprobs,
                [CompletionOutput(0, seq.text, seq.token_ids.copy(), None, None, None, None)],
                False, m.snapshot(), st.num_cached_tokens))
        self.num_generated_tokens += num_tokens
        for up in core.updates:
            st = states.get(up.request_id)
            if st is not None and self._update(st, up, now, stops):
                touched[up.request_id] = st
        final_only, delta = RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA
        for rid, st in touched.items():
            if st.num_finished_seqs == len(st.seqs):
                st.finished = True
                st.metrics.finished_time = now
                self.finished_metrics.append(st.metrics)
                states.pop(rid, None)
                self._wants_texts.discard(rid)
            elif st.params.output_kind == final_only:
                continue  # nobody reads it before the end
            out = self._make_delta(st) if st.params.output_kind == delta \
                else self._make_output(st)
            if out is not None:
                outputs.append(out)
        return outputs, stops

    def _update(self, st: _ReqState, up: SeqUpdate, now: float,
                stops: list[tuple[str, str]]) -> bool:
        """One sequence's update on the general path (any params, any finish); False
        when it is dropped (the sequence was stopped by a stop string)."""
        seq = st.seqs[up.index]
        if up.num_draft_tokens:  # speculative decoding counts
            st.metrics.num_drafts += 1
            st.metrics.num_draft_tokens += up.num_draft_tokens
            st.metrics.num_accepted_tokens += up.num_accepted_tokens
        if seq.finish_reason is not None:
            return False  # stopped by a stop string: later tokens are dropped
        if up.new_token_ids:
            matched = self._append(st, seq, up, now)
            if matched is not None:
                st.num_finished_seqs += 1
                if up.finish_reason is None:
                    stops.append((up.seq_id, matched))
        if up.finish_reason is not None and seq.finish_reason is None:
            st.num_finished_seqs += 1
            seq.finish_reason = up.finish_reason
            seq.stop_reason = up.stop_reason
            if seq.params.detokenize and seq.stop.stopped is None:
                seq.stop.add(seq.detok.flush())
            seq.text = seq.stop.text
        return True

    def _append(self, st: _ReqState, seq: _Seq, up: SeqUpdate, now: float) -> str | None:
        """Add the new tokens; returns the stop string matched, if any."""
        m = st.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        seq.cumulative_logprob += up.logprob
        if seq.logprobs is not None:
            k = seq.params.logprobs
            seq.logprobs.append(make_logprobs_dict(
                up.new_token_ids[0], float(up.logprob), int(up.rank), up.topk_ids[:k],
                up.topk_logprobs[:k], self._decoded.get))
        matched = None
        stop, detok = seq.stop, seq.detok if seq.params.detokenize else None
        for tok in up.new_token_ids:
            seq.token_ids.append(tok)
            self.num_generated_tokens += 1
            matched = stop.add(detok.add(tok) if detok is not None else "")
            if matched is not None:
                seq.finish_reason, seq.stop_reason = "stop", matched
                break
        seq.text = stop.text if seq.finish_reason or not stop.stop \
            else stop.text[:stop.num_safe_chars]
        return matched

    def _add_prompt_logprobs(self, st: _ReqState, chunk: tuple) -> None:
        if st.prompt_logprobs is None:
            return
        start, lp, rank, tk_ids, tk_lp = chunk
        k = st.params.prompt_logprobs
        prompt = st.prompt_token_ids
        for j in range(len(lp)):
            pos = start + j + 1  # the token whose logprob this is
            if pos >= len(prompt) or pos < len(st.prompt_logprobs):
                continue
            st.prompt_logprobs.append(make_logprobs_dict(
                prompt[pos], float(lp[j]), int(rank[j]), tk_ids[j][:k], tk_lp[j][:k],
                self._decoded.get))

    def _decode_all(self, core: CoreOutput) -> None:
        """Decode every token id this step's logprob dicts name, in one batched call."""
        if not self._wants_texts:
            return  # no live request has logprob dicts
        want: set[int] = set()
        for up in core.updates:
            st = self._states.get(up.request_id)
            if st is None or not up.new_token_ids or st.seqs[up.index].logprobs is None:
                continue
            want.add(int(up.new_token_ids[0]))
            want.update(int(t) for t in up.topk_ids[:st.params.logprobs])
        for rid, (start, _, _, tk_ids, _) in core.prompt_logprobs.items():
            st = self._states.get(rid)
            if st is None or st.prompt_logprobs is None:
                continue
            k = st.params.prompt_logprobs
            want.update(int(t) for t in np.asarray(tk_ids)[:, :k].ravel())
            n = len(tk_ids)
            want.update(int(t) for t in st.prompt_token_ids[start + 1:start + 1 + n])
        missing = [t for t in want if t not in self._decoded]
        if not missing:
            return
        if len(self._decoded) + len(missing) > self.DECODE_CACHE:
            self._decoded.clear()
        texts = self.tokenizer.batch_decode([[t] for t in missing])
        self._decoded.update(zip(missing, texts))

    @staticmethod
    def _make_output(st: _ReqState) -> RequestOutput:
        outs = [CompletionOutput(  # st.seqs: created in index order
            i, s.text, s.token_ids.copy(),
            s.cumulative_logprob if s.logprobs is not None else None,
            s.logprobs.copy() if s.logprobs is not None else None,
            s.finish_reason, s.stop_reason) for i, s in st.seqs.items()]
        return RequestOutput(st.request_id, st.prompt, st.prompt_token_ids, st.prompt_logprobs,
                             outs, st.finished, st.metrics.snapshot(), st.num_cached_tokens,
                             _prompt_hidden(st))

    @staticmethod
    def _make_delta(st: _ReqState) -> RequestOutput | None:
        """output_kind=DELTA: only what earlier outputs did not carry (text, token ids,
        logprobs; prompt logprobs in the first output only), so the outputs concatenate
        to the cumulative one; None when nothing is new and the request goes on."""
        outs, first = [], not any(s.sent_tokens or s.sent_final for s in st.seqs.values())
        for i, s in st.seqs.items():
            if s.sent_final:
                continue
            text, ids = s.text[s.sent_text:], s.token_ids[s.sent_tokens:]
            if not text and not ids and s.finish_reason is None:
                continue
            lps = s.logprobs[s.sent_tokens:] if s.logprobs is not None else None
            s.sent_text, s.sent_tokens = len(s.text), len(s.token_ids)
            s.sent_final = s.finish_reason is not None
            outs.append(CompletionOutput(
                i, text, ids, s.cumulative_logprob if s.logprobs is not None else None, lps,
                s.finish_reason, s.stop_reason))
        if not outs and not st.finished:
            return None
        return RequestOutput(st.request_id, st.prompt, st.prompt_token_ids,
                             st.prompt_logprobs if first else None, outs, st.finished,
                             st.metrics.snapshot(), st.num_cached_tokens,
                             _prompt_hidden(st) if st.finished else None)


def _prompt_hidden(st: _ReqState):
    """The prompt's final hidden states, f32[tokens, H] ("all") or [1, H] ("last"),
    once every chunk arrived; None otherwise."""
    if st.hidden is None or not st.finished:
        return None
    import numpy as np

    n = len(st.prompt_token_ids)
    starts = sorted(k for k in st.hidden if k < n)
    rows = np.concatenate([st.hidden[k] for k in starts], axis=0)[:n]
    return rows[-1:] if st.params.prompt_hidden_states == "last" else rows
