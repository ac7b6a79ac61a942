"""How the Python API reports a bad argument: the exception type and the quoted value.

A value of the wrong type raises :class:`ArgumentTypeError` (a ``TypeError``
that is also a ``ValueError``); a value out of range raises ``ValueError``.
Messages name the argument, quote the value with :func:`short` (cut to
``MAX_QUOTE_CHARS``) and say what is accepted.
"""

from __future__ import annotations

from typing import Any


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (a TypeError; also a ValueError, so that code
    catching bad input as ValueError catches it too)."""


MAX_QUOTE_CHARS = 60


def short(value: Any, limit: int = MAX_QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, with its type and full size said."""
    try:
        r = repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int too large to print
        return f"<{type(value).__name__}>"
    if len(r) <= limit:
        return r
    return f"{r[:limit]}... ({type(value).__name__}, {len(r)} characters)"
