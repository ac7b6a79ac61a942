"""What a launched step is until fetched, and what it gives back (host side).

:class:`ModelLaunched`: the model part dispatched, the sampler waiting (a
structured-output step, whose masks need the previous step's tokens);
:class:`Launched`: the whole step dispatched; :class:`StepResult`: its sampled
tokens and logprobs as numpy (``Runner.fetch``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass
class StepResult:
    token_ids: np.ndarray  # i32[R]
    logprob: np.ndarray  # f32[R]
    rank: np.ndarray  # i32[R]
    topk_ids: np.ndarray  # i32[R, K]
    topk_logprobs: np.ndarray  # f32[R, K]
    prompt_logprobs: dict[str, tuple[np.ndarray, ...]]  # request_id -> arrays for its chunk
    # request_id -> f32[chunk tokens, H]: final hidden states (SamplingParams.prompt_hidden_states)
    prompt_hidden: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, launched: "Launched", out, plp, hidden) -> "StepResult":
        """The result of ``launched`` from its fetched sampler output, prompt logprob
        arrays and hidden states (each row's own chunk of the last two)."""
        cu = launched.cu_q_lens
        prompt_out, pooled = {}, {}
        for i, rid in enumerate(launched.row_ids):
            a, b = int(cu[i]), int(cu[i + 1])
            if plp is not None and rid in launched.prompt_lp:
                prompt_out[rid] = tuple(np.asarray(x)[a:b] for x in plp)
            if hidden is not None and rid in launched.pool_rows:
                pooled[rid] = np.asarray(hidden)[a:b]
        return cls(np.asarray(out.token_ids), np.asarray(out.logprob), np.asarray(out.rank),
                   np.asarray(out.topk_ids), np.asarray(out.topk_logprobs), prompt_out, pooled)


@dataclasses.dataclass
class Launched:
    """A dispatched step: device results not fetched yet."""

    sampled: jax.Array  # the SamplerOutput packed (sampler.pack_output)
    plp: Any  # prompt logprob arrays or None
    tokens: jax.Array  # i32[S_MAX] sampled token of each sampling row < S_MAX (next step's source)
    cu_q_lens: np.ndarray
    row_ids: list[str]
    prompt_lp: dict[str, int]
    t0: float
    hidden: Any = None  # f32[T, H] on the device when pool_rows asked for it
    pool_rows: Any = None  # request ids whose rows' hidden states to fetch


@dataclasses.dataclass
class ModelLaunched:
    """A step whose model part is dispatched and whose sampling waits for
    ``Runner.launch_sample`` (structured outputs: a grammar row's mask needs the
    previous step's token, fetched while this step's forward runs)."""

    logits: Any  # f32[S, V] on the device
    plp: Any
    st: Any  # the SamplingTensors built at launch (numpy)
    resample: Any  # grammar bits (sampling row -> mask) -> the SamplingTensors with them
    sample_index: np.ndarray
    num_logprobs: Any
    shape: tuple
    prompt_k: Any
    cu_q_lens: np.ndarray
    row_ids: list[str]
    prompt_lp: dict[str, int]
    t0: float
    hidden: Any = None
    pool_rows: Any = None
