"""Default sampling values from the model's ``generation_config.json``, as vLLM applies
them (``generation_config="auto"``, its default): a request that leaves a value unset
gets the model's; one that sets it keeps its own.

    defaults = generation_defaults(resolved.generation_config, args.generation_config)
    # {"temperature": 0.6, "top_p": 0.95, "top_k": 20}

``generation_config="vllm"`` turns this off (SamplingParams' own defaults); a folder
path reads that folder's ``generation_config.json`` instead of the model's.
"""

from __future__ import annotations

import json
import os

# generation_config.json key -> SamplingParams field
KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
        "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def generation_defaults(model_config: dict, setting: str = "auto") -> dict:
    """SamplingParams field -> the model's default, for the keys the config sets."""
    if setting == "vllm":
        return {}
    if setting != "auto":
        path = os.path.join(os.path.expanduser(setting), "generation_config.json")
        if not os.path.isfile(path):
            raise ValueError(f"generation_config={setting!r}: no generation_config.json there; "
                             "give 'auto' (the model's), 'vllm' (off) or a folder holding one")
        with open(path) as f:
            model_config = json.load(f)
    out = {}
    for key, field in KEYS.items():
        value = model_config.get(key)
        if value is not None:
            out[field] = value
    return out
