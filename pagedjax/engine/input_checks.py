"""Checks of the Python API's arguments, made at the call (LLM, AsyncLLM, LLMEngine).

They raise before anything is queued: ``ArgumentTypeError`` (a ``TypeError``
that is also a ``ValueError``) for a value of the wrong type and ``ValueError``
for one out of range, each naming the argument, quoting the value (shortened)
and saying what is accepted, as the HTTP server does for the same mistakes.
Token ids outside the model's vocabulary are refused here as they are over HTTP.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from pagedjax.arguments import ArgumentTypeError, short
from pagedjax.sampling_params import SamplingParams

PROMPT_FORMS = ("a string, a list of token ids, or a dict with 'prompt' (a string) or "
                "'prompt_token_ids' (a list of token ids)")


def _is_id(t: Any) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


def token_ids(name: str, ids: Any, vocab_size: int) -> list[int]:
    """``ids`` as a list of ints in [0, vocab_size) (ArgumentTypeError / ValueError)."""
    if isinstance(ids, np.ndarray):
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)):
        raise ArgumentTypeError(f"{name} must be a list of token ids (int), got "
                                f"{type(ids).__name__} {short(ids)}.")
    bad = next((t for t in ids if not _is_id(t)), None)
    if bad is not None:
        raise ArgumentTypeError(f"{name} must hold integer token ids, got {short(bad)} "
                                f"({type(bad).__name__}).")
    out = [int(t) for t in ids]
    bad = [t for t in out if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{name} holds token id {short(bad[0])}, outside the model's "
                         f"vocabulary: ids must be in [0, {vocab_size}).")
    return out


def is_single_prompt(prompt: Any) -> bool:
    """A prompt (not a list of prompts): a string, a dict or a non-empty list of ids."""
    return isinstance(prompt, (str, dict)) or (
        isinstance(prompt, (list, tuple)) and len(prompt) > 0 and _is_id(prompt[0]))


def check_prompt(prompt: Any, name: str = "prompt") -> None:
    """The prompt's form (not yet its ids' range): ArgumentTypeError naming ``name``."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" not in prompt and "prompt" not in prompt:
            raise ValueError(f"{name} is a dict without 'prompt' or 'prompt_token_ids' "
                             f"(keys: {short(sorted(map(str, prompt))[:8])}); give {PROMPT_FORMS}.")
        text = prompt.get("prompt")
        if "prompt_token_ids" not in prompt and not isinstance(text, str):
            raise ArgumentTypeError(f"{name}['prompt'] must be a string, got "
                                    f"{type(text).__name__} {short(text)}.")
        return
    if isinstance(prompt, str):
        return
    if isinstance(prompt, (list, tuple, np.ndarray)):
        return  # the ids are checked when tokenized
    raise ArgumentTypeError(f"{name} must be {PROMPT_FORMS}; got {type(prompt).__name__} "
                            f"{short(prompt)}.")


def prompt_list(prompts: Any) -> list:
    """``LLM.generate``'s ``prompts`` as a list of single prompts."""
    if is_single_prompt(prompts):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise ArgumentTypeError(f"prompts must be {PROMPT_FORMS}, or a list of them; got "
                                f"{type(prompts).__name__} {short(prompts)}.")
    for i, p in enumerate(prompts):
        check_prompt(p, f"prompts[{i}]")
    return list(prompts)


def sampling_params(params: Any, name: str = "sampling_params") -> SamplingParams:
    """``params`` (None: the defaults) as SamplingParams (ArgumentTypeError otherwise)."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        hint = " (build one: SamplingParams(**your_dict))" if isinstance(params, dict) else ""
        raise ArgumentTypeError(f"{name} must be a pagedjax.SamplingParams, got "
                                f"{type(params).__name__} {short(params)}{hint}.")
    return params


def request_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ArgumentTypeError(f"request_id must be a non-empty string, got {short(value)}.")
    return value


def priority(value: Any, name: str = "priority") -> int:
    if not _is_id(value):
        raise ArgumentTypeError(f"{name} must be an integer, got {short(value)}.")
    return int(value)


def per_prompt(name: str, value: Any, n: int, check) -> Optional[list]:
    """A per-prompt list argument (or None): its length and each entry checked."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise ArgumentTypeError(f"{name} must be a list with one entry per prompt, got "
                                f"{type(value).__name__} {short(value)}.")
    if len(value) != n:
        raise ValueError(f"{name} must have one entry per prompt ({n}), got {len(value)}.")
    return [check(v, f"{name}[{i}]") for i, v in enumerate(value)]


def unknown_kwargs(owner: str, given, fields) -> None:
    """TypeError for keyword arguments that are not EngineArgs fields (closest named)."""
    import difflib

    unknown = sorted(set(given) - set(fields))
    if not unknown:
        return
    hints = [f"{u!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, fields, 1))
             else repr(u) for u in unknown[:5]]
    raise TypeError(f"{owner}() got unknown argument(s) {', '.join(hints)}; the valid ones "
                    "are the fields of pagedjax.config.EngineArgs.")
