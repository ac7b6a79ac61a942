"""One chat choice's tool calls in OpenAI's shapes, from a parser's events.

``ChoiceTools`` wraps the parser a ``ToolPlan`` calls for (none: text passes
through; auto: the server's ``--tool-call-parser``; required / named: the
readers of the constrained JSON) and turns its events into

* a non-streaming ``message``: ``content`` (None when only calls were made)
  and ``tool_calls`` = ``[{"id", "type": "function", "function": {"name",
  "arguments"}}]``;
* streaming ``delta``s: ``content`` pieces and ``tool_calls`` pieces, the
  first of a call with its ``index``, ``id``, ``type`` and ``name``, later
  ones with more ``arguments``.

White space at the end of the content so far is held back: dropped when a
call follows (or when the output ends after calls), given out when more
text follows, so streamed and whole responses have the same content.
"""

from __future__ import annotations

import uuid
from typing import Optional

from pagedjax.entrypoints.openai.tool_parsers import Event, ToolParser, get_tool_parser
from pagedjax.entrypoints.openai.tool_parsers.constrained import (NamedCallParser,
                                                                  RequiredCallsParser)
from pagedjax.entrypoints.openai.tools import ToolPlan


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def make_parser(plan: ToolPlan, auto_parser: Optional[str]) -> Optional[ToolParser]:
    if plan.mode == "named":
        return NamedCallParser(plan.name)
    if plan.mode == "required":
        return RequiredCallsParser()
    if plan.mode == "auto" and auto_parser:
        return get_tool_parser(auto_parser)()
    return None


class ChoiceTools:
    def __init__(self, plan: ToolPlan, auto_parser: Optional[str] = None):
        self.plan = plan
        self.parser = make_parser(plan, auto_parser)
        self.calls: list[dict] = []
        self._space = ""  # white-space content held back

    @property
    def active(self) -> bool:
        return self.parser is not None

    def finish_reason(self, engine_reason: Optional[str]) -> Optional[str]:
        """'tool_calls' when calls were made (auto, required) and the output ended
        normally; a named function keeps 'stop' as OpenAI and vLLM do."""
        if self.calls and self.plan.mode != "named" and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    # ------------------------------------------------------------------ streaming
    def delta(self, text: str, final: bool) -> dict:
        """The delta for ``text`` (more of the output); ``final`` flushes the parser."""
        if self.parser is None:
            return {"content": text} if text else {}
        events = self.parser.feed(text) if text else []
        if final:
            events += self.parser.finish()
        content, calls = self._apply(events, final)
        d: dict = {}
        if content:
            d["content"] = content
        if calls:
            d["tool_calls"] = calls
        return d

    def _apply(self, events: list[Event], final: bool) -> tuple[str, list[dict]]:
        content, deltas = [], []
        for kind, value in events:
            if kind == "content":
                text = self._space + value
                body = text.rstrip()
                self._space = text[len(body):]
                if body:
                    content.append(body)
            elif kind == "start":
                self._space = ""  # white space before a call is not content
                self.calls.append({"id": call_id(), "type": "function",
                                   "function": {"name": value, "arguments": ""}})
                deltas.append({"index": len(self.calls) - 1, "id": self.calls[-1]["id"],
                               "type": "function",
                               "function": {"name": value, "arguments": ""}})
            elif kind == "args" and self.calls:
                self.calls[-1]["function"]["arguments"] += value
                last = deltas[-1] if deltas else None
                if last is not None and last["index"] == len(self.calls) - 1:
                    last["function"]["arguments"] = last["function"].get("arguments", "") + value
                else:
                    deltas.append({"index": len(self.calls) - 1,
                                   "function": {"arguments": value}})
        if final and self._space and not self.calls:
            content.append(self._space)
        if final:
            self._space = ""
        return "".join(content), deltas

    # ------------------------------------------------------------------ whole output
    def message(self, text: str) -> dict:
        """The assistant message of a complete (non-streamed) output. A required or
        named choice cut short (``max_tokens``) keeps the calls written out in full;
        with none, the text is given as content."""
        if self.parser is None:
            return {"role": "assistant", "content": text, "tool_calls": []}
        d = self.delta(text, final=True)
        if isinstance(self.parser, RequiredCallsParser):
            self.calls = self.calls[:self.parser.complete_calls()]
        elif isinstance(self.parser, NamedCallParser) and self.calls:
            self.calls = self.calls[:self.parser.complete_calls(
                self.calls[0]["function"]["arguments"])]
        if self.plan.constrained and not self.calls:
            return {"role": "assistant", "content": text, "tool_calls": []}
        return {"role": "assistant", "content": d.get("content") or None,
                "tool_calls": self.calls}
