"""Llama 3.1/3.2's JSON tool calls: ``{"name": ..., "parameters": {...}}``.

The output is a call when it starts (after white space) with ``{`` or with
``<|python_tag|>``; several calls may follow one another, separated by white
space or ``;``. Anything else is content. If a JSON value is not a call (or
does not parse when the output ends), the text from there on is content; if
no call was found before it, the whole output is.
"""

from __future__ import annotations

import json

from pagedjax.entrypoints.openai.tool_parsers.base import Event, ToolParser, call_events

PYTHON_TAG = "<|python_tag|>"
_SEPARATORS = " \t\r\n;"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def __init__(self):
        self.raw = ""  # everything fed, for the all-content fallback
        self.buf = ""
        self.state = "start"  # start -> json | text
        self.num_calls = 0
        self._decoder = json.JSONDecoder()

    def feed(self, text: str) -> list[Event]:
        self.raw += text
        if self.state == "text":
            return [("content", text)] if text else []
        self.buf += text
        if self.state == "start":
            s = self.buf.lstrip()
            if not s or (PYTHON_TAG.startswith(s) and len(s) < len(PYTHON_TAG)):
                return []  # white space, or maybe the start of the tag
            if s.startswith(PYTHON_TAG):
                self.buf, self.state = s[len(PYTHON_TAG):], "json"
            elif s.startswith("{"):
                self.buf, self.state = s, "json"
            else:
                return self._to_text(self.buf)
        return self._calls(final=False)

    def finish(self) -> list[Event]:
        if self.state == "start":
            buf, self.buf = self.buf, ""
            return [("content", buf)] if buf else []
        if self.state == "json":
            events = self._calls(final=True)
            self.buf = ""
            return events
        return []

    def _to_text(self, rest: str) -> list[Event]:
        """Switch to plain text: ``rest``, or everything if no call came before."""
        self.state, self.buf = "text", ""
        out = rest if self.num_calls else self.raw
        return [("content", out)] if out else []

    def _calls(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            s = self.buf.lstrip(_SEPARATORS)
            if not s:
                self.buf = s
                return events
            if not s.startswith("{"):
                return events + self._to_text(s)
            try:
                obj, end = self._decoder.raw_decode(s)
            except ValueError:
                if final:
                    return events + self._to_text(s)
                self.buf = s
                return events  # maybe not complete yet
            call = call_events(obj, ("parameters", "arguments"))
            if call is None:
                return events + self._to_text(s)
            events += call
            self.num_calls += 1
            self.buf = s[end:]
