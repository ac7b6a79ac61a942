"""Structured outputs: grammars compiled by llguidance and per-sequence token masks."""
