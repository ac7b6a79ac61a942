"""Sampling parameters with vLLM's names, defaults and validation.

``SamplingParams`` is what users pass to ``LLM.generate`` and what the server
builds from an OpenAI request. Every check raises ``ValueError`` with a message
that names the field, the bound and the value received (shortened by
:func:`short`), so a user knows what to change; a value of the wrong type raises
:class:`ArgumentTypeError`, which is both a ``TypeError`` and a ``ValueError``.
Limits that shape device arrays are module constants.
"""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from pagedjax.arguments import ArgumentTypeError, short  # noqa: F401 - re-exported

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5
# Most logprobs a request may ask for (per generated or prompt token); vLLM's
# server default ``max_logprobs``.
MAX_LOGPROBS = 20
# Most ``logit_bias`` entries (OpenAI's limit) and their allowed range.
MAX_LOGIT_BIAS = 300
LOGIT_BIAS_RANGE = 100.0
# Bans are sent to the device in a fixed-width array: EOS + stop_token_ids
# while min_tokens is not reached, and one next-token ban per bad-word variant.
MAX_STOP_TOKEN_IDS = 64
MAX_BAD_WORDS = 64
# Seeds are 64-bit (two uint32 words of a threefry key).
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


class RequestOutputKind(enum.IntEnum):
    """What ``AsyncLLM.generate`` yields (vLLM's names).

    CUMULATIVE: every output holds the whole text and token ids so far.
    DELTA: every output holds only what is new since the previous one.
    FINAL_ONLY: one output, when the request finishes.
    ``LLM.generate`` always returns final outputs. An IntEnum, so that
    parameters serialize to JSON (multi-host replay); plain 0/1/2 are accepted.
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


def _as_list(name: str, value: Any, what: str) -> list:
    """A list/tuple (or None -> []) as a list; ArgumentTypeError otherwise."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ArgumentTypeError(f"{name} must be {what}, got {type(value).__name__} "
                                f"{short(value)}.")
    return list(value)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _logit_bias(value: Any) -> dict[int, float]:
    """{token id: bias}; string keys of digits are accepted (OpenAI's JSON form)."""
    if not isinstance(value, dict):
        raise ArgumentTypeError("logit_bias must be a dict {token id: bias}, got "
                                f"{type(value).__name__} {short(value)}.")
    out = {}
    for k, v in value.items():
        if isinstance(k, str) and k.isascii() and k.isdigit():
            k = int(k)
        if not _is_int(k):
            raise ArgumentTypeError(f"logit_bias keys must be token ids (int), got {short(k)}.")
        if not _is_number(v):
            raise ArgumentTypeError(f"logit_bias values must be numbers, got {short(v)} for "
                                    f"token {k}.")
        out[k] = float(v)
    return out


@dataclass
class StructuredOutputsParams:
    """Constrain the output to a JSON schema, regex, choice list or grammar (vLLM's names).

    Exactly one of ``json`` (a JSON schema, as a dict or a JSON string),
    ``regex``, ``choice`` (a list of strings), ``grammar`` (a Lark grammar, or
    llama.cpp's GBNF) or ``json_object=True`` (any JSON object) must be given.
    ``disable_any_whitespace`` keeps JSON compact (no free whitespace between
    tokens). ``start_after`` (token ids, e.g. a reasoning model's ``</think>``)
    leaves the output free until that sequence appears in it; the constraint
    applies to what follows. The spec is checked (and compiled, cached) when the request is
    added; an invalid schema, regex or grammar raises ``ValueError`` there.
    See docs/structured_outputs.md.
    """

    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    disable_any_whitespace: bool = False
    start_after: Optional[list[int]] = None

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar")
                 if getattr(self, k) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise ValueError(
                "structured_outputs needs exactly one of json, regex, choice, grammar or "
                f"json_object=True; got {given or 'none'}.")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError("structured_outputs.json must be a JSON schema (a dict or a JSON "
                             f"string), got {type(self.json).__name__}.")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, "
                                 f"got {short(v)}.")
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, (list, tuple)):
                raise ValueError("structured_outputs.choice must be a list of strings, "
                                 f"got {short(self.choice)}.")
            self.choice = list(self.choice)
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of "
                                 f"non-empty strings, got {short(self.choice)}.")
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be True or False, "
                             f"got {short(self.json_object)}.")
        if self.start_after is not None:
            ok = isinstance(self.start_after, (list, tuple)) and self.start_after and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0
                for t in self.start_after)
            if not ok:
                raise ValueError("structured_outputs.start_after must be a non-empty list of "
                                 f"token ids, got {short(self.start_after)}.")
            self.start_after = [int(t) for t in self.start_after]
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError("structured_outputs.disable_any_whitespace must be True or False, "
                             f"got {short(self.disable_any_whitespace)}.")

    @property
    def kind(self) -> str:
        """Which constraint: 'json', 'regex', 'choice', 'grammar' or 'json_object'."""
        for k in ("json", "regex", "choice", "grammar"):
            if getattr(self, k) is not None:
                return k
        return "json_object"


@dataclass
class SamplingParams:
    """Sampling parameters for text generation (vLLM's fields and defaults).

    ``top_k`` 0 or -1 turns top-k off (stored as 0). ``stop`` accepts a string
    or a list and is stored as a list; ``stop_token_ids`` and ``bad_words``
    likewise become lists.
    """

    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: Optional[dict[int, float]] = None
    allowed_token_ids: Optional[list[int]] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: Optional[StructuredOutputsParams] = None
    # Pooling (embeddings): the final hidden states of the prompt in the output's
    # ``prompt_hidden_states``: "last" (the last prompt token's) or "all" (every
    # prompt token's; the prompt then skips the prefix cache, as prompt_logprobs do).
    # With max_tokens=0 the request is prefill only: it ends after its prompt, with
    # no token sampled (finish_reason "length").
    prompt_hidden_states: Optional[str] = None
    # EOS ids from the model / generation config (see update_from_generation_config).
    _eos_token_ids: list[int] = field(default_factory=list, init=False, repr=False,
                                      compare=False)

    def __post_init__(self) -> None:
        # Normalise containers first so that checks see one form.
        self.stop = [self.stop] if isinstance(self.stop, str) else _as_list(
            "stop", self.stop, "a string or a list of strings")
        self.stop_token_ids = _as_list("stop_token_ids", self.stop_token_ids,
                                       "a list of token ids")
        self.bad_words = _as_list("bad_words", self.bad_words, "a list of strings")
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _as_list("allowed_token_ids", self.allowed_token_ids,
                                              "a list of token ids")
        if _is_int(self.output_kind) and not isinstance(self.output_kind, RequestOutputKind) \
                and self.output_kind in (0, 1, 2):
            self.output_kind = RequestOutputKind(self.output_kind)
        if isinstance(self.structured_outputs, dict):  # e.g. from JSON (multi-host replay)
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if _is_int(self.top_k) and self.top_k == -1:
            self.top_k = 0
        if self.best_of is None:
            self.best_of = self.n
        self._verify_args()
        if self.temperature < SAMPLING_EPS:
            # Greedy: the filters cannot change argmax; turn them off (vLLM).
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0

    # ------------------------------------------------------------------ checks
    def _verify_args(self) -> None:
        def need_int(name: str, lo: Optional[int] = None, hi: Optional[int] = None,
                     optional: bool = False, hint: str = "") -> None:
            v = getattr(self, name)
            if v is None and optional:
                return
            if not _is_int(v):
                raise ArgumentTypeError(f"{name} must be an integer, got {short(v)}.")
            if lo is not None and v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}.{hint}")
            if hi is not None and v > hi:
                raise ValueError(f"{name} must be <= {hi}, got {v}.{hint}")

        def need_num(name: str) -> float:
            v = getattr(self, name)
            if not _is_number(v):
                raise ArgumentTypeError(f"{name} must be a finite number, got {short(v)}.")
            if not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {short(v)}.")
            return float(v)

        need_int("n", 1)
        need_int("best_of", 1)
        if self.best_of < self.n:
            raise ValueError(
                f"best_of must be >= n, got n={self.n} and best_of={self.best_of}.")
        for name in ("presence_penalty", "frequency_penalty"):
            v = need_num(name)
            if not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v}.")
        if need_num("repetition_penalty") <= 0.0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}.")
        if need_num("temperature") < 0.0:
            raise ValueError(
                f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        top_p = need_num("top_p")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}.")
        need_int("top_k", 0, hint=" Use 0 or -1 to turn top-k off.")
        min_p = need_num("min_p")
        if not 0.0 <= min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {min_p}.")
        need_int("seed", SEED_MIN, SEED_MAX, optional=True)
        # max_tokens=0: prefill only (pooling), nothing is sampled.
        need_int("max_tokens", 0 if self.prompt_hidden_states is not None else 1,
                 optional=True,
                 hint=" max_tokens=0 (prefill only) needs prompt_hidden_states."
                 if self.max_tokens == 0 else "")
        if self.max_tokens == 0 and self.n != 1:
            raise ValueError(f"max_tokens=0 (prefill only) samples nothing: n must be 1, got "
                             f"n={self.n}.")
        need_int("min_tokens", 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens} "
                f"and max_tokens={self.max_tokens}.")
        hint = f" (the limit is pagedjax.sampling_params.MAX_LOGPROBS = {MAX_LOGPROBS})"
        need_int("logprobs", 0, MAX_LOGPROBS, optional=True, hint=hint)
        need_int("prompt_logprobs", 0, MAX_LOGPROBS, optional=True, hint=hint)
        if self.prompt_hidden_states not in (None, "last", "all"):
            raise ValueError("prompt_hidden_states must be None, 'last' or 'all', got "
                             f"{self.prompt_hidden_states!r}.")
        for s in self.stop:
            if not isinstance(s, str):
                raise ArgumentTypeError(f"stop must be a string or a list of strings, got "
                                        f"{short(s)} in the list.")
            if s == "":
                raise ValueError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise ValueError(
                "stop strings are only supported when detokenize is True; "
                "set detokenize=True or use stop_token_ids.")
        self._check_ids("stop_token_ids", self.stop_token_ids, MAX_STOP_TOKEN_IDS)
        if len(self.bad_words) > MAX_BAD_WORDS:
            raise ValueError(
                f"bad_words may hold at most {MAX_BAD_WORDS} words "
                f"(MAX_BAD_WORDS), got {len(self.bad_words)}.")
        for w in self.bad_words:
            if not isinstance(w, str):
                raise ArgumentTypeError(f"bad_words must be non-empty strings, got {short(w)}.")
            if not w.strip():
                raise ValueError(f"bad_words must be non-empty strings, got {short(w)}.")
        if self.logit_bias is not None:
            if len(self.logit_bias) > MAX_LOGIT_BIAS:
                raise ValueError(
                    f"logit_bias may hold at most {MAX_LOGIT_BIAS} entries "
                    f"(MAX_LOGIT_BIAS), got {len(self.logit_bias)}.")
            for tok, b in self.logit_bias.items():
                if tok < 0:
                    raise ValueError(f"logit_bias token ids must be >= 0, got {tok}.")
                if not (math.isfinite(b) and abs(b) <= LOGIT_BIAS_RANGE):
                    raise ValueError(
                        f"logit_bias values must be in [-{LOGIT_BIAS_RANGE:g}, "
                        f"{LOGIT_BIAS_RANGE:g}], got {b} for token {tok}.")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise ValueError(
                    "allowed_token_ids must not be empty; pass None to allow all tokens.")
            self._check_ids("allowed_token_ids", self.allowed_token_ids, None)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ArgumentTypeError(
                "output_kind must be a pagedjax.sampling_params.RequestOutputKind "
                f"(CUMULATIVE, DELTA or FINAL_ONLY), got {short(self.output_kind)}.")
        if self.structured_outputs is not None and not isinstance(
                self.structured_outputs, StructuredOutputsParams):
            raise ArgumentTypeError("structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}.")
        for name in ("include_stop_str_in_output", "ignore_eos", "detokenize",
                     "skip_special_tokens", "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentTypeError(
                    f"{name} must be True or False, got {short(getattr(self, name))}.")

    @staticmethod
    def _check_ids(name: str, ids: list, limit: Optional[int]) -> None:
        if limit is not None and len(ids) > limit:
            raise ValueError(f"{name} may hold at most {limit} ids, got {len(ids)}.")
        for t in ids:
            if not _is_int(t):
                raise ArgumentTypeError(f"{name} must hold integer token ids, got {short(t)}.")
            if t < 0:
                raise ValueError(f"{name} must hold non-negative token ids, got {t}.")

    def verify_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if a token id in the params is >= vocab_size."""
        groups = [("stop_token_ids", self.stop_token_ids),
                  ("allowed_token_ids", self.allowed_token_ids or []),
                  ("logit_bias", list((self.logit_bias or {}).keys()))]
        for name, ids in groups:
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise ValueError(
                    f"{name} holds token id {bad[0]}, outside the model's vocabulary "
                    f"of size {vocab_size}.")

    # -------------------------------------------------------------- accessors
    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def all_stop_token_ids(self) -> set[int]:
        """stop_token_ids plus the model's EOS ids (unless ignore_eos)."""
        out = set(self.stop_token_ids)
        if not self.ignore_eos:
            out.update(self._eos_token_ids)
        return out

    @property
    def output_text_buffer_length(self) -> int:
        """Characters held back while streaming so a stop string can be cut."""
        if self.stop and not self.include_stop_str_in_output:
            return max(len(s) for s in self.stop) - 1
        return 0

    def update_from_generation_config(self, generation_config: dict,
                                      model_eos_token_id: Optional[int] = None) -> None:
        """Record the model's EOS ids (from the tokenizer and generation_config)."""
        eos: list[int] = []
        if model_eos_token_id is not None:
            eos.append(int(model_eos_token_id))
        gen_eos = (generation_config or {}).get("eos_token_id")
        if gen_eos is not None:
            eos.extend([gen_eos] if _is_int(gen_eos) else list(gen_eos))
        self._eos_token_ids = sorted(set(eos))

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)


@dataclass
class BeamSearchParams:
    """Beam search parameters (vLLM's ``BeamSearchParams``)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.beam_width) or self.beam_width < 1:
            raise ValueError(
                f"beam_width must be an integer >= 1, got {short(self.beam_width)}.")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(
                f"max_tokens must be an integer >= 1, got {short(self.max_tokens)}.")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {short(self.temperature)}.")
        if not _is_number(self.length_penalty) or not math.isfinite(self.length_penalty):
            raise ValueError(
                f"length_penalty must be a finite number, got {short(self.length_penalty)}.")

    def clone(self) -> "BeamSearchParams":
        return copy.deepcopy(self)
