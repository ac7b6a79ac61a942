"""Helpers for parsers that read tags out of streamed text (tool calls, reasoning)."""

from __future__ import annotations


def held_back(buf: str, token: str) -> int:
    """How many trailing characters of ``buf`` could be the start of ``token``."""
    for k in range(min(len(buf), len(token) - 1), 0, -1):
        if token.startswith(buf[-k:]):
            return k
    return 0
