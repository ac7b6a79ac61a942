"""What one EngineCore step hands out: plain per-sequence results (no JAX, no text).

:class:`SeqUpdate` is one sequence's step (new token ids, logprob arrays,
finish reason, request and sample index); :class:`CoreOutput` is the whole
step. The core (``core.py``) makes them; the output processor
(``output_processor.py``) turns them into ``RequestOutput``s.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(slots=True)
class SeqUpdate:
    """What one step did to one sequence (the core's output, plain Python)."""

    seq_id: str  # the scheduler's id of the sequence
    request_id: str  # the request it belongs to
    index: int  # sample index within the request (n > 1)
    new_token_ids: list[int]
    logprob: float = 0.0  # of the new token (0.0 when none)
    rank: int = 0
    topk_ids: Any = ()  # i32[k] when the request wants logprobs
    topk_logprobs: Any = ()  # f32[k]
    finish_reason: str | None = None  # set by the core (EOS, stop token, length, abort)
    stop_reason: Any = None
    num_draft_tokens: int = 0  # speculative decoding: tokens proposed for this step's row
    num_accepted_tokens: int = 0  # ... and accepted by the target


@dataclasses.dataclass
class CoreOutput:
    """One core step: sequence updates, prompt logprob chunks, first-scheduled requests."""

    updates: list[SeqUpdate] = dataclasses.field(default_factory=list)
    # request id -> (first position, token ids, logprob, rank, topk ids, topk logprobs)
    prompt_logprobs: dict[str, tuple] = dataclasses.field(default_factory=dict)
    # request id -> (first position, f32[chunk tokens, H]) final hidden states of the prompt
    prompt_hidden: dict[str, tuple] = dataclasses.field(default_factory=dict)
    first_scheduled: dict[str, float] = dataclasses.field(default_factory=dict)  # id -> time
    num_cached_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    # Sequences of one-sample requests without logprobs that got one token and go on
    # (the common decode row), as two columns instead of one SeqUpdate each: the
    # request id (= the sequence id) and the token.
    token_request_ids: list[str] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
