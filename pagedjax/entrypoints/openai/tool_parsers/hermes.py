"""The Hermes tool-call format (Qwen2.5, Hermes 2/3, many fine-tunes).

The model writes each call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
possibly after some text and several in a row. Text outside the tags is
content; a block whose JSON is not a call is given back as content, tags and
all. A last block left open when the output ends (a stop string or EOS cut the
closing tag) is still a call if its JSON parses.
"""

from __future__ import annotations

import json

from pagedjax.entrypoints.openai.tool_parsers.base import Event, ToolParser, call_events, held_back

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self):
        self.buf = ""
        self.inside = False

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        events: list[Event] = []
        while True:
            if not self.inside:
                i = self.buf.find(OPEN)
                if i < 0:
                    keep = held_back(self.buf, OPEN)
                    out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                    if out:
                        events.append(("content", out))
                    return events
                if i:
                    events.append(("content", self.buf[:i]))
                self.buf, self.inside = self.buf[i + len(OPEN):], True
            j = self.buf.find(CLOSE)
            if j < 0:
                return events
            events += self._block(self.buf[:j], closed=True)
            self.buf, self.inside = self.buf[j + len(CLOSE):], False

    def finish(self) -> list[Event]:
        buf, inside = self.buf, self.inside
        self.buf, self.inside = "", False
        if inside:
            return self._block(buf, closed=False)
        return [("content", buf)] if buf else []

    @staticmethod
    def _block(body: str, closed: bool) -> list[Event]:
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        events = call_events(obj, ("arguments", "parameters"))
        if events is not None:
            return events
        return [("content", OPEN + body + (CLOSE if closed else ""))]
