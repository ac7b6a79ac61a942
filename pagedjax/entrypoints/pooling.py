"""Embeddings from a decoder: pooling the prompt's final hidden states.

A pooling request is a prefill-only request (``max_tokens=0``) whose
``SamplingParams`` ask for the prompt's final hidden states
(``prompt_hidden_states``): it is prefilled in the continuous batch with
everything else, on the same page pool, and ends with its prompt: no sampler
row, no page for a next token. The states are pooled on the host:

* ``last``: the last prompt token's state (Qwen3-Embedding, e5-mistral and
  other decoder embedders); only that row comes back, and the prompt may use
  the prefix cache (its last token is always computed);
* ``mean``: the mean over the prompt's tokens (every row comes back, and the
  prompt skips the prefix cache so that every position is computed);

then ``dimensions`` (Matryoshka: the first ``d`` components) and L2
normalisation (``normalize``, on by default), in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pagedjax.sampling_params import RequestOutputKind, SamplingParams

POOLING_TYPES = ("last", "mean")


def check_pooling(pooling: str, dimensions: Optional[int], hidden_size: int) -> None:
    if pooling not in POOLING_TYPES:
        raise ValueError(f"pooling must be one of {POOLING_TYPES}, got {pooling!r}")
    if dimensions is not None and not (isinstance(dimensions, int) and
                                       1 <= dimensions <= hidden_size):
        raise ValueError(f"dimensions must be an integer in [1, {hidden_size}] (the model's "
                         f"hidden size), got {dimensions!r}")


def pooling_params(pooling: str) -> SamplingParams:
    """The engine request of one embedding: prefill only, nothing sampled."""
    return SamplingParams(max_tokens=0, temperature=0.0, detokenize=False,
                          prompt_hidden_states="last" if pooling == "last" else "all",
                          output_kind=RequestOutputKind.FINAL_ONLY)


def pool(hidden: np.ndarray, pooling: str, normalize: bool = True,
         dimensions: Optional[int] = None) -> np.ndarray:
    """f32[tokens, H] (or [1, H] for 'last') -> f32[d] embedding."""
    h = np.asarray(hidden, np.float32)
    v = h[-1] if pooling == "last" else h.mean(axis=0)
    if dimensions is not None:
        v = v[:dimensions]
    if normalize:
        v = v / max(float(np.linalg.norm(v)), 1e-12)
    return v


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """vLLM's shape: ``out.outputs.embedding``."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
