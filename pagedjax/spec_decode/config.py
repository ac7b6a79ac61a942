"""``speculative_config``: vLLM's JSON/dict form, validated into one frozen object.

Two methods, with vLLM's keys:

* n-gram prompt lookup: ``{"method": "ngram", "num_speculative_tokens": k,
  "prompt_lookup_max": 4, "prompt_lookup_min": 1}``;
* a draft model sharing the target's tokenizer: ``{"model": path,
  "num_speculative_tokens": k}`` (``"method": "draft_model"`` is implied).

Host only, no JAX: ``config.py`` validates ``EngineArgs.speculative_config``
through :func:`parse_speculative_config`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16
_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model"}


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" | "draft_model"
    num_speculative_tokens: int  # k: tokens proposed per decode row per step
    prompt_lookup_max: int = 4  # ngram: longest suffix matched
    prompt_lookup_min: int = 1  # ngram: shortest suffix matched
    model: str | None = None  # draft model: HF folder, .gguf file or short name


def _int(d: dict, key: str, default: Any, lo: int, hi: int) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"speculative_config[{key!r}] must be an integer in [{lo}, {hi}], "
                         f"got {v!r}")
    return v


def parse_speculative_config(value: Any) -> SpeculativeConfig | None:
    """None, a dict, a JSON string or a SpeculativeConfig -> SpeculativeConfig | None.

    Raises ValueError naming the key to change.
    """
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative_config is not valid JSON ({e}); e.g. "
                             '\'{"method": "ngram", "num_speculative_tokens": 4}\'') from None
    if not isinstance(value, dict):
        raise ValueError("speculative_config must be a dict or a JSON object, got "
                         f"{type(value).__name__}")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise ValueError(f"speculative_config: unknown key(s) {unknown}; valid: {sorted(_KEYS)}")
    method = value.get("method") or ("draft_model" if value.get("model") else None)
    if method not in METHODS:
        raise ValueError(f"speculative_config['method'] must be one of {', '.join(METHODS)} "
                         f"(or give 'model' for a draft model), got {method!r}")
    if "num_speculative_tokens" not in value:
        raise ValueError("speculative_config needs 'num_speculative_tokens' (e.g. 4)")
    k = _int(value, "num_speculative_tokens", None, 1, MAX_SPECULATIVE_TOKENS)
    if method == "ngram":
        if value.get("model"):
            raise ValueError("speculative_config: method 'ngram' takes no 'model'; drop it or "
                             "drop 'method' to use the draft model")
        hi = _int(value, "prompt_lookup_max", 4, 1, 1024)
        lo = _int(value, "prompt_lookup_min", min(1, hi), 1, 1024)
        if lo > hi:
            raise ValueError(f"speculative_config: prompt_lookup_min ({lo}) must be <= "
                             f"prompt_lookup_max ({hi})")
        return SpeculativeConfig("ngram", k, hi, lo)
    model = value.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("speculative_config: the draft model method needs 'model' (an HF "
                         "folder, .gguf file or short name sharing the target's tokenizer)")
    for key in ("prompt_lookup_max", "prompt_lookup_min"):
        if key in value:
            raise ValueError(f"speculative_config[{key!r}] applies to method 'ngram' only")
    return SpeculativeConfig("draft_model", k, model=model)
