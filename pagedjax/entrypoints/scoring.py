"""Cross-encoder scoring with a decoder, as Qwen3-Reranker does.

A (query, document) pair is written into the reranker's prompt; the model's
next-token logits for "yes" and "no" give the score
``softmax([logit_no, logit_yes])[1] = sigmoid(logit_yes - logit_no)``.

On the engine each pair is one pooling request (prefill only, no sampler row)
asking for the last prompt token's final hidden state; the engine's own logits
head (``LLMEngine.logits_of``) turns those states into the "yes" and "no"
logits. Pairs share their common prompt prefix through prefix caching and run
in the continuous batch with everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from pagedjax.entrypoints.pooling import pooling_params
from pagedjax.sampling_params import SamplingParams

SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the '
          'Instruct provided. Note that the answer can only be "yes" or "no".')
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def rerank_prompt(query: str, document: str, instruction: Optional[str] = None) -> str:
    """Qwen3-Reranker's prompt for one pair."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
            f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
            f"<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def pairs_of(text_1: Union[str, Sequence[str]], text_2: Union[str, Sequence[str]]
             ) -> list[tuple[str, str]]:
    """vLLM's pairing: one text_1 against each text_2, or the two lists zipped."""
    t1 = [text_1] if isinstance(text_1, str) else list(text_1)
    t2 = [text_2] if isinstance(text_2, str) else list(text_2)
    if not t1 or not t2:
        raise ValueError("text_1 and text_2 must not be empty")
    if len(t1) == 1:
        return [(t1[0], d) for d in t2]
    if len(t1) != len(t2):
        raise ValueError(f"text_1 has {len(t1)} texts and text_2 {len(t2)}; give one text_1, "
                         "or as many as text_2")
    return list(zip(t1, t2))


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """vLLM's shape: ``out.outputs.score``."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput


class YesNoScorer:
    """Prompts and sampling parameters of yes/no scoring for one tokenizer."""

    def __init__(self, tokenizer, yes: str = "yes", no: str = "no"):
        self.tokenizer = tokenizer
        ids = []
        for word in (yes, no):
            t = tokenizer.encode(word, add_special_tokens=False)
            if len(t) != 1:
                raise ValueError(f"scoring needs {word!r} to be one token in this tokenizer; "
                                 f"it is {len(t)}")
            ids.append(t[0])
        self.yes_id, self.no_id = ids

    def prompt_ids(self, query: str, document: str, instruction: Optional[str] = None
                   ) -> list[int]:
        return list(self.tokenizer.encode(rerank_prompt(query, document, instruction),
                                          add_special_tokens=False))

    @staticmethod
    def params() -> SamplingParams:
        """A pair's engine request: prefill only, the last token's hidden state back."""
        return pooling_params("last")

    def scores(self, outputs, logits_of) -> list[float]:
        """The pairs' scores from their finished requests' outputs; ``logits_of``:
        f32[n, H] final hidden states -> f32[n, vocab] logits (``LLMEngine.logits_of``)."""
        hidden = np.concatenate([np.asarray(o.prompt_hidden_states, np.float32)[-1:]
                                 for o in outputs], axis=0)
        logits = np.asarray(logits_of(hidden), np.float64)
        d = logits[:, self.yes_id] - logits[:, self.no_id]
        # softmax([no, yes])[1] = sigmoid(yes - no), without overflow either way
        return [float(1.0 / (1.0 + np.exp(-x)) if x >= 0 else np.exp(x) / (1.0 + np.exp(x)))
                for x in d]
