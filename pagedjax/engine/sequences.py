"""What the engine core keeps per live sequence, between steps (host side).

A *sequence* is one scheduler request: a request's sample (n > 1 forks its
children) or a beam. Each live sequence has a row in the runner's persistent
batch (``worker/input_batch.py``: its request and sample index, sampling
columns, page table), added by :meth:`Sequences.add` / :meth:`Sequences.join`
and removed by :meth:`Sequences.forget`. :class:`Sequences` holds each
request's :class:`RequestSampling` (its sampling state, fixed when it is added,
and what the output processor has been told already) and the sets the core's
per-row loops read without further checks:

* ``steady``: sequences whose next one-sample row needs no work from the core
  (no grammar, not a fork, already reported to the output processor);
* ``token_only``: the sequences of requests whose steps leave the core as bare
  tokens (``RequestSampling.token_only``: one sample, so the sequence id is the
  request id), ``CoreOutput``'s two token columns;
* ``topk``: a beam sequence's newest top-k logprobs, until taken.

:meth:`Sequences.forget` drops a sequence from all of them, and its request
once no sequence of it is left; ``forgotten`` remembers which request a
sequence forgotten during the current step belonged to (``begin_step`` starts one).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedjax.sampling_params import SamplingParams

# Fallback seeds of a request's samples: fallback_seed + SEED_STRIDE * index, kept
# inside the positive int32 range (a prime stride keeps nearby requests apart).
SEED_STRIDE = 7919
SEED_MODULUS = 2**31 - 1
# An n > 1 request's sample i with a seed gets seed + i, kept below this (SamplingParams.seed
# is a non-negative 64-bit integer).
PARAMS_SEED_MODULUS = 2**63


@dataclasses.dataclass(slots=True)
class RequestSampling:
    """Per-request sampling state, fixed at add time (plus what the core reported)."""

    params: list[SamplingParams]  # per sample index (seed + i for n > 1)
    fallback_seed: int
    bad_words_ids: list
    prompt_logprobs: int | None
    needs_history: bool  # the host must know every token before the next step
    keep_topk: bool  # beam search reads each step's top-k
    seqs: set[str]  # the request's live sequence ids
    grammar: Any = None  # structured outputs: a structured_output.grammar.GrammarState
    pool: str | None = None  # SamplingParams.prompt_hidden_states ("last" / "all")
    # What the output processor was told: scheduled at all, prefix-cached tokens.
    reported_scheduled: bool = False
    reported_cached: int = -1
    # One sample, no logprobs, no top-k for beams, no grammar: the core reports its
    # tokens in CoreOutput's token columns, not as SeqUpdates.
    token_only: bool = dataclasses.field(init=False, default=False)  # (derived: __post_init__)

    def __post_init__(self):
        self.token_only = len(self.params) == 1 and self.params[0].logprobs is None \
            and not self.keep_topk and self.grammar is None

    def fallback(self, index: int) -> int:
        """Sample ``index``'s seed when its params give none: distinct per sample."""
        return (self.fallback_seed + SEED_STRIDE * index) % SEED_MODULUS

    @property
    def serial(self) -> bool:
        """While this request lives, steps run serially (see the module docstring)."""
        return self.needs_history or self.keep_topk

    @property
    def token_by_token(self) -> bool:
        """Each token must be known before the next is chosen (no speculation)."""
        return self.serial or self.grammar is not None


class Sequences:
    """The core's per-sequence and per-request state (see the module docstring)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch  # the runner's InputBatch: one row per live sequence
        self.sampling: dict[str, RequestSampling] = {}  # request id -> sampling state
        self.steady: set[str] = set()
        self.token_only: set[str] = set()
        self.topk: dict[str, dict[int, float]] = {}
        self.forgotten: dict[str, str] = {}  # seq id -> request id, this step
        self.num_serial = 0  # live requests whose steps must run serially

    def begin_step(self) -> None:
        """A new step: forget which requests the sequences forgotten before it had."""
        self.forgotten = {}

    def add(self, req: Any, s: RequestSampling) -> None:
        """A new request (a ``core.request.Request``), with its first sequence (the
        same id, sample 0)."""
        self.sampling[req.request_id] = s
        self.num_serial += s.serial
        self.join(req.request_id, req.request_id, 0, req)
        if s.token_only:
            self.token_only.add(req.request_id)

    def join(self, sid: str, request_id: str, index: int, req: Any) -> None:
        """Sequence ``sid`` (sample ``index``, the scheduler's request ``req``) belongs
        to ``request_id``: it gets a row in the batch."""
        s = self.sampling[request_id]
        self.batch.add(sid, request_id, index, s, req.prompt_token_ids, req.output_token_ids,
                       req.lora_int_id, s.grammar is not None)
        s.seqs.add(sid)

    def root(self, sid: str) -> tuple[str, int] | None:
        """(request id, sample index) of a live sequence, else None."""
        return self.batch.request_of(sid)

    def forget(self, sid: str) -> None:
        """Sequence ``sid`` is gone; so is its request once no sequence is left."""
        self.topk.pop(sid, None)
        self.steady.discard(sid)
        self.token_only.discard(sid)
        ref = self.batch.request_of(sid)
        if ref is None:
            return
        self.batch.remove(sid)
        self.forgotten[sid] = ref[0]
        s = self.sampling.get(ref[0])
        if s is not None:
            s.seqs.discard(sid)
            if s.grammar is not None:
                s.grammar.drop(sid)
            if not s.seqs:
                del self.sampling[ref[0]]
                self.num_serial -= s.serial

    def request_of(self, sid: str) -> str | None:
        """The request of a live sequence or of one forgotten during this step."""
        ref = self.batch.request_of(sid)
        return ref[0] if ref is not None else self.forgotten.get(sid)

    def seq_ids(self, request_id: str) -> list[str]:
        """The live sequences of a request ([] when it has none)."""
        s = self.sampling.get(request_id)
        return list(s.seqs) if s is not None else []
