"""A reasoning parser applied to chat requests (the server's and ``LLM.chat``'s).

For each choice a :class:`pagedjax.entrypoints.reasoning.ReasoningParser`
(built for the rendered prompt) splits the output; the server puts the
reasoning in ``message.reasoning_content`` (streamed: ``delta.reasoning_content``)
and hands only the content to the tool-call parser. A structured output or a forced tool
call constrains only what follows the reasoning, as in vLLM: the constraint gets
``start_after`` = the end tag's token ids, so the thinking is free and the
grammar starts after ``</think>``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from pagedjax.entrypoints.reasoning.base import ReasoningParser
from pagedjax.sampling_params import StructuredOutputsParams

PROMPT_TAIL_TOKENS = 32  # the prompt's end, decoded, says whether it opened a block


class ChatReasoning:
    """The server's reasoning parser applied to one request."""

    def __init__(self, name: str, tokenizer, prompt_ids: list[int]):
        from pagedjax.entrypoints.reasoning import get_reasoning_parser

        self.cls = get_reasoning_parser(name)
        self.tokenizer = tokenizer
        self.prompt_tail = tokenizer.decode(list(prompt_ids[-PROMPT_TAIL_TOKENS:]))

    def parser(self) -> ReasoningParser:
        return self.cls.for_prompt(self.prompt_tail)

    def constrain_after(self, spec: Optional[StructuredOutputsParams]
                        ) -> Optional[StructuredOutputsParams]:
        """``spec`` applied after the reasoning (unchanged when the prompt closed it)."""
        if spec is None or not self.parser().may_reason:
            return spec
        end = self.tokenizer.encode(self.cls.end_tag, add_special_tokens=False)
        return dataclasses.replace(spec, start_after=list(end))


class ChoiceReasoning:
    """One choice's split: ``delta`` for streams, ``split`` for whole outputs."""

    def __init__(self, reasoning: Optional[ChatReasoning]):
        self.parser = reasoning.parser() if reasoning is not None else None

    def delta(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning piece, content piece) of more output."""
        if self.parser is None:
            return "", text
        r, c = self.parser.feed(text) if text else ("", "")
        if final:
            r2, c2 = self.parser.finish()
            r, c = r + r2, c + c2
        return r, c

    def split(self, text: str) -> tuple[Optional[str], str]:
        """(reasoning or None, content) of a whole output."""
        if self.parser is None:
            return None, text
        reasoning, content = self.parser.split(text)
        return reasoning, content or ""
