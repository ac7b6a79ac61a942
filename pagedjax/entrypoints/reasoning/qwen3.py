"""Qwen3: ``<think>...</think>`` when the model thinks; plain content when it does not.

Qwen3's template opens no block by itself; with ``enable_thinking=False`` it
writes an empty, closed one, and the output is all content. An output that
starts with ``<think>`` is reasoning up to ``</think>`` (all of it if cut
before). Templates that end the prompt with an open ``<think>`` (the 2507
thinking models) start the output in reasoning.
"""

from __future__ import annotations

from pagedjax.entrypoints.reasoning.base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    starts_in_reasoning = False
