"""DeepSeek-R1 and its distillations: the output starts in reasoning.

R1's template ends the prompt with ``<think>\\n``, so the output holds only the
closing ``</think>``; everything before it is reasoning (all of it when the
output is cut before). A ``<think>`` the model writes anyway is dropped. A
prompt whose last block is already closed starts the output in content.
"""

from __future__ import annotations

from pagedjax.entrypoints.reasoning.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    starts_in_reasoning = True
