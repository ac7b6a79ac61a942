"""Small helpers every layer may use (no imports of pagedjax)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division for ints and numpy ints: the pages that ``a`` tokens fill."""
    return -(-a // b)
