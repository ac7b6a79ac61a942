"""Reasoning parsers (``--reasoning-parser`` / ``LLM.chat(reasoning_parser=...)``)."""

from __future__ import annotations

from pagedjax.entrypoints.reasoning.base import ReasoningParser
from pagedjax.entrypoints.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from pagedjax.entrypoints.reasoning.qwen3 import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    Qwen3ReasoningParser.name: Qwen3ReasoningParser,
    DeepSeekR1ReasoningParser.name: DeepSeekR1ReasoningParser,
}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of "
                         f"{sorted(REASONING_PARSERS)}") from None


__all__ = ["ReasoningParser", "REASONING_PARSERS", "get_reasoning_parser"]
