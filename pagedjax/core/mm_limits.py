"""``limit_mm_per_prompt``: the most items of each modality one prompt may carry
(host side, no JAX; read by EngineArgs.validate and the multimodal processor)."""

from __future__ import annotations

SUPPORTED_MODALITIES = ("image",)


def parse_limits(limit_mm_per_prompt) -> dict[str, int]:
    """``limit_mm_per_prompt`` ({"image": N} or its JSON) -> {modality: N}."""
    import json

    if limit_mm_per_prompt in (None, ""):
        return {}
    value = limit_mm_per_prompt
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"limit_mm_per_prompt: not JSON ({e}); give e.g. "
                             '\'{"image": 4}\'') from None
    if not isinstance(value, dict):
        raise ValueError(f"limit_mm_per_prompt must map a modality to a count, got {value!r}")
    for k, v in value.items():
        if k not in SUPPORTED_MODALITIES:
            raise ValueError(f"limit_mm_per_prompt: modality {k!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_MODALITIES)})")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"limit_mm_per_prompt[{k!r}] must be an integer >= 0, got {v!r}")
    return dict(value)
