"""Reasoning parsers: a model's thinking apart from its answer, piece by piece.

Reasoning models write their thinking between ``<think>`` and ``</think>``
before the answer. A parser is fed the output text (whole, or delta by delta
when streaming) and splits it into ``(reasoning, content)`` pieces; both ways
give the same split, however the text is cut, because a piece that could be
the start of a tag is held back until the next piece decides it.

Where the output begins depends on the prompt: a chat template may open the
block itself (DeepSeek-R1's ends the prompt with ``<think>\\n``) or close it
at once (Qwen3's with ``enable_thinking=False`` writes an empty block), so a
parser is built for one prompt with :meth:`ReasoningParser.for_prompt`.
"""

from __future__ import annotations

from typing import Optional

from pagedjax.entrypoints.text_tags import held_back


class ReasoningParser:
    """Splits ``<think>...</think>`` reasoning from content (subclasses pick the
    default: does an output with no opening tag start in reasoning?)."""

    name = "base"
    start_tag = "<think>"
    end_tag = "</think>"
    starts_in_reasoning = False  # with no opening tag in the output or the prompt

    def __init__(self, in_reasoning: Optional[bool] = None):
        self._default = self.starts_in_reasoning if in_reasoning is None else in_reasoning
        self._phase = "start"  # start -> reasoning -> content
        self._buf = ""
        self.entered = False  # a reasoning block was opened (in the prompt or the output)
        self.ended = False  # its end tag was read
        # False when the prompt closed the block (thinking off): no reasoning to wait for
        self.may_reason = True

    @classmethod
    def for_prompt(cls, prompt_text: str) -> "ReasoningParser":
        """A parser for the output of ``prompt_text``: in reasoning from the start
        when the prompt leaves a block open, in content when its last block is
        closed, else the parser's default."""
        opened, closed = prompt_text.rfind(cls.start_tag), prompt_text.rfind(cls.end_tag)
        if opened < 0 and closed < 0:
            return cls()
        p = cls(in_reasoning=opened > closed)
        p.may_reason = opened > closed  # a closed block: the model answers at once
        return p

    # ------------------------------------------------------------------ streaming
    def feed(self, text: str) -> tuple[str, str]:
        """More output -> (reasoning piece, content piece)."""
        self._buf += text
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        """The output ended: whatever was held back."""
        return self._run(final=True)

    def split(self, text: str) -> tuple[Optional[str], Optional[str]]:
        """A whole output -> (reasoning or None, content or None)."""
        r1, c1 = self.feed(text)
        r2, c2 = self.finish()
        reasoning, content = r1 + r2, c1 + c2
        return (reasoning if self.entered else None), (content or None)

    def _run(self, final: bool) -> tuple[str, str]:
        reasoning, content = "", ""
        if self._phase == "start":
            head = self._buf.lstrip()
            if head.startswith(self.start_tag):
                self._buf = head[len(self.start_tag):]
                self._phase = "reasoning"
            elif not final and self.start_tag.startswith(head):
                return "", ""  # could still be the opening tag
            else:
                self._phase = "reasoning" if self._default else "content"
            self.entered = self._phase == "reasoning"
        if self._phase == "reasoning":
            at = self._buf.find(self.end_tag)
            if at >= 0:
                reasoning, self._buf = self._buf[:at], self._buf[at + len(self.end_tag):]
                self._phase, self.ended = "content", True
            else:
                keep = 0 if final else held_back(self._buf, self.end_tag)
                cut = len(self._buf) - keep
                reasoning, self._buf = self._buf[:cut], self._buf[cut:]
        if self._phase == "content":
            content, self._buf = self._buf, ""
        return reasoning, content

    @property
    def in_reasoning(self) -> bool:
        """The output so far is (or, with nothing yet, will start in) reasoning."""
        return self._phase == "reasoning" or (self._phase == "start" and self._default)
