"""JSON schemas with their objects closed, as grammar backends' strict modes read them.

A tool's ``parameters`` often list ``properties`` without saying
``"additionalProperties": false``. Read literally, the constrained output may
then invent keys forever (a small model does: ``"unit_map": ..``,
``"unit_map_map": ..``), and the call never ends. vLLM's default grammar
backend compiles tool schemas in a strict mode where such objects take only
their listed properties; :func:`closed` gives the same reading: every object
schema with ``properties`` and no ``additionalProperties`` /
``patternProperties`` / ``unevaluatedProperties`` of its own gets
``"additionalProperties": false``. A schema that says otherwise keeps it.
"""

from __future__ import annotations

from typing import Any

_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
MAX_DEPTH = 64


def closed(schema: Any, depth: int = 0) -> Any:
    """A copy of ``schema`` with its objects closed (the input is left as it is)."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v, depth + 1) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(v, depth + 1) for v in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key], depth + 1)
    if isinstance(out.get("properties"), dict) and not any(k in out for k in _OPEN_KEYS):
        out["additionalProperties"] = False
    return out
