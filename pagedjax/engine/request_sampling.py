"""What the engine core keeps per request for sampling, between steps.

:class:`RequestSampling` is fixed when a request is added (its per-sample
params, fallback seed, bad words, prompt logprobs, grammar) and holds what the
core reuses step after step: each sample's static sampler row
(``sampling_tensors.static_row``) and what the output processor has been told
already (a sequence's reusable ``SampleRow`` is in ``sequences.Sequences.steady``).
Host only, no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedjax.sampling_params import SamplingParams
from pagedjax.sample.metadata import static_row


@dataclasses.dataclass(slots=True)
class RequestSampling:
    """Per-request sampling state, fixed at add time (plus what the core reuses
    between steps: static rows, what it reported)."""

    params: list[SamplingParams]  # per sample index (seed + i for n > 1)
    fallback_seed: int
    bad_words_ids: list
    prompt_logprobs: int | None
    needs_history: bool  # the host must know every token before the next step
    keep_topk: bool  # beam search reads each step's top-k
    seqs: set[str]  # the request's live sequence ids
    grammar: Any = None  # structured outputs: a structured_outputs.GrammarState
    pool: str | None = None  # SamplingParams.prompt_hidden_states ("last" / "all")
    statics: dict = dataclasses.field(default_factory=dict)  # index -> sampler.static_row
    # What the output processor was told: scheduled at all, prefix-cached tokens.
    reported_scheduled: bool = False
    reported_cached: int = -1
    # One sample, no logprobs, no top-k for beams, no grammar: the core reports its
    # tokens in CoreOutput's plain columns, not as SeqUpdates.
    plain: bool = dataclasses.field(init=False, default=False)  # (derived: __post_init__)

    def __post_init__(self):
        self.plain = len(self.params) == 1 and self.params[0].logprobs is None \
            and not self.keep_topk and self.grammar is None

    def fallback(self, index: int) -> int:
        return (self.fallback_seed + 7919 * index) % (2**31 - 1)

    def static(self, index: int) -> tuple:
        st = self.statics.get(index)
        if st is None:
            st = self.statics[index] = static_row(self.params[index], self.fallback(index))
        return st

    @property
    def serial(self) -> bool:
        """While this request lives, steps run serially (see the module docstring)."""
        return self.needs_history or self.keep_topk

    @property
    def token_by_token(self) -> bool:
        """Each token must be known before the next is chosen (no speculation)."""
        return self.serial or self.grammar is not None
