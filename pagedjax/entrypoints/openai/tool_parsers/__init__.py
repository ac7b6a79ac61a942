"""Tool-call parsers for ``tool_choice="auto"``, chosen with ``--tool-call-parser``."""

from __future__ import annotations

from pagedjax.entrypoints.openai.tool_parsers.base import Event, ToolParser
from pagedjax.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from pagedjax.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    HermesToolParser.name: HermesToolParser,
    Llama3JsonToolParser.name: Llama3JsonToolParser,
}


def get_tool_parser(name: str) -> type[ToolParser]:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool call parser {name!r}; choose one of "
                         f"{sorted(TOOL_PARSERS)}") from None


__all__ = ["Event", "ToolParser", "TOOL_PARSERS", "get_tool_parser"]
