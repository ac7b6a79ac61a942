"""Request outputs with vLLM's names and fields.

Logprobs follow vLLM: ``CompletionOutput.logprobs`` is a list with one
``dict[token_id, Logprob]`` per generated token, holding the sampled token and
the top-k tokens (k + 1 entries, or k when the sampled token is in the top k).
``RequestOutput.prompt_logprobs`` is the same per prompt token, with ``None``
for the first token (it has no logprob).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, Sequence, Union


@dataclass(slots=True)
class Logprob:
    """Log probability of one token, its rank (1 = most likely) and its text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[Optional[dict[int, Logprob]]]


def make_logprobs_dict(token_id: int, logprob: float, rank: int,
                       topk_ids: Sequence[int] = (), topk_logprobs: Sequence[float] = (),
                       decode: Optional[Callable[[int], str]] = None) -> dict[int, Logprob]:
    """One position's logprobs dict from the sampler's arrays (one row of them).

    The sampled token comes first; the top-k follow with ranks 1..k.
    """
    dec = decode or (lambda _t: None)
    out = {int(token_id): Logprob(float(logprob), int(rank), dec(int(token_id)))}
    for i, (t, lp) in enumerate(zip(topk_ids, topk_logprobs)):
        t = int(t)
        if t not in out:
            out[t] = Logprob(float(lp), i + 1, dec(t))
    return out


@dataclass(slots=True)
class CompletionOutput:
    """One completion (of the ``n``) of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" | "error"
    stop_reason: Union[int, str, None] = None  # the stop string or stop token id
    # LLM.chat(reasoning_parser=...): the thinking; ``text`` then holds the answer only
    reasoning_content: Optional[str] = None

    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, "
                f"token_ids={self.token_ids}, cumulative_logprob={self.cumulative_logprob}, "
                f"logprobs={self.logprobs}, finish_reason={self.finish_reason}, "
                f"stop_reason={self.stop_reason})")


@dataclass(slots=True)
class RequestMetrics:
    """Times (seconds, time.time()) of a request's life."""

    arrival_time: float
    last_token_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    time_in_queue: Optional[float] = None
    finished_time: Optional[float] = None
    # Speculative decoding (all sequences of the request): verified steps that had
    # proposals, tokens proposed, tokens accepted.
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def snapshot(self) -> "RequestMetrics":
        """A copy (outputs carry the times as of their step)."""
        return RequestMetrics(*_metric_fields(self))

    @property
    def acceptance_rate(self) -> Optional[float]:
        """Accepted / proposed tokens (None without proposals)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> Optional[float]:
        """Tokens emitted per verified step: 1 + accepted / drafts (vLLM's mean
        acceptance length; None without proposals)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


# Every field of a RequestMetrics, in order, read in one C call (snapshot runs per
# request per step).
_metric_fields = operator.attrgetter(*(f.name for f in fields(RequestMetrics)))


@dataclass(slots=True)
class RequestOutput:
    """What ``LLM.generate`` returns per prompt and the engine streams."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[list[int]]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    num_cached_tokens: Optional[int] = 0
    # SamplingParams.prompt_hidden_states: the prompt's final hidden states (numpy
    # f32[tokens, H], or [1, H] for "last"), in the finished output
    prompt_hidden_states: Optional[Any] = None

    def add(self, next_output: "RequestOutput", aggregate: bool = True) -> None:
        """Merge a later (delta) output of the same request into this one."""
        self.finished |= next_output.finished
        self.metrics = next_output.metrics or self.metrics
        self.num_cached_tokens = next_output.num_cached_tokens
        if next_output.prompt_hidden_states is not None:
            self.prompt_hidden_states = next_output.prompt_hidden_states
        for nxt in next_output.outputs:
            for i, cur in enumerate(self.outputs):
                if cur.index == nxt.index:
                    if aggregate:
                        cur.text += nxt.text
                        cur.token_ids = list(cur.token_ids) + list(nxt.token_ids)
                        if nxt.logprobs:
                            cur.logprobs = (cur.logprobs or []) + nxt.logprobs
                        cur.cumulative_logprob = nxt.cumulative_logprob
                        cur.finish_reason = nxt.finish_reason
                        cur.stop_reason = nxt.stop_reason
                    else:
                        self.outputs[i] = nxt
                    break
            else:
                self.outputs.append(nxt)

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, "
                f"prompt_logprobs={self.prompt_logprobs}, outputs={self.outputs}, "
                f"finished={self.finished}, metrics={self.metrics}, "
                f"num_cached_tokens={self.num_cached_tokens})")


@dataclass
class BeamSearchSequence:
    """One beam: prompt + generated tokens, their logprobs and the beam score."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


@dataclass
class BeamSearchOutput:
    """The best ``beam_width`` sequences of a beam search, best first."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(tokens: Sequence[int], cumulative_logprob: float,
                          eos_token_id: Optional[int], length_penalty: float = 1.0) -> float:
    """vLLM's beam score: cumulative logprob / length ** length_penalty.

    A final EOS token is not counted in the length.
    """
    seq_len = len(tokens)
    if seq_len and eos_token_id is not None and tokens[-1] == eos_token_id:
        seq_len -= 1
    return cumulative_logprob / (max(seq_len, 1) ** length_penalty)
