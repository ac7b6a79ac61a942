"""Reading the output of ``tool_choice="required"`` or a named function.

These outputs were constrained by ``tools.tool_schema``, so they are JSON of a
known shape; the parsers here stream the calls out of it as it is written:

* named: the whole output is the arguments of that function;
* required: ``[{"name": ..., "parameters": {...}}, ...]``. A small scanner
  follows the array (strings, escapes, nesting) and gives each call's name
  once its string is complete, then the raw text of its ``parameters`` value
  piece by piece, so the streamed arguments are exactly the non-streamed ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from pagedjax.entrypoints.openai.tool_parsers.base import Event, ToolParser


class NamedCallParser(ToolParser):
    name = "named"

    def __init__(self, function_name: str):
        self.function_name = function_name
        self.started = False

    def feed(self, text: str) -> list[Event]:
        if not self.started:
            text = text.lstrip()
            if not text:
                return []
            self.started = True
            return [("start", self.function_name), ("args", text)]
        return [("args", text)] if text else []

    def finish(self) -> list[Event]:
        return []

    def complete_calls(self, arguments: str) -> int:
        """1 when the arguments written are a whole JSON value, else 0 (cut short)."""
        try:
            json.loads(arguments)
        except ValueError:
            return 0
        return 1


@dataclass
class _Call:
    name: Optional[str] = None
    args_start: Optional[int] = None
    args_end: Optional[int] = None
    container: bool = False
    sent: int = 0  # characters of the arguments given out
    started: bool = False
    closed: bool = False  # its object's closing brace was read


class RequiredCallsParser(ToolParser):
    """Streams the calls of a JSON array of ``{"name", "parameters"}`` objects."""

    name = "required"

    def __init__(self):
        self.text = ""
        self.calls: list[_Call] = []
        self.depth = 0
        self.in_str = self.esc = False
        self.str_start = 0
        self.key: Optional[str] = None  # the key just read at the call's level
        self.value_key: Optional[str] = None  # the key whose value comes next / is read

    def feed(self, text: str) -> list[Event]:
        start = len(self.text)
        self.text += text
        for i in range(start, len(self.text)):
            self._step(i, self.text[i])
        return self._emit()

    def finish(self) -> list[Event]:
        return self._emit()

    def valid(self) -> bool:
        """The whole output is the JSON array it had to be."""
        try:
            return isinstance(json.loads(self.text), list)
        except ValueError:
            return False

    def complete_calls(self) -> int:
        """How many leading calls were written out in full (all of them when the
        output is valid; fewer when ``max_tokens`` cut it inside a call)."""
        n = 0
        for call in self.calls:
            if not (call.closed and call.name is not None and call.args_end is not None):
                break
            n += 1
        return n

    def _step(self, i: int, c: str) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                self._string_done(self.text[self.str_start:i + 1])
            return
        call = self.calls[-1] if self.calls else None
        if (call is not None and self.depth == 2 and self.value_key == "parameters"
                and call.args_start is None and not c.isspace()):
            call.args_start, call.container = i, c in "{["
        if c == '"':
            self.in_str, self.str_start = True, i
        elif c in "{[":
            self.depth += 1
            if self.depth == 2 and c == "{":
                self.calls.append(_Call())
                self.key = self.value_key = None
        elif c in "}]":
            if call is not None and self.depth == 3 and self.value_key == "parameters" \
                    and call.container and call.args_end is None:
                call.args_end = i + 1
            self._end_primitive(call, i)
            if call is not None and self.depth == 2 and c == "}":
                call.closed = True
            self.depth -= 1
        elif c == ":" and self.depth == 2:
            self.value_key = self.key
        elif c == "," and self.depth == 2:
            self._end_primitive(call, i)
            self.key = self.value_key = None

    def _end_primitive(self, call: Optional[_Call], i: int) -> None:
        if (call is not None and self.depth == 2 and call.args_start is not None
                and not call.container and call.args_end is None):
            call.args_end = i - (len(self.text[call.args_start:i]) -
                                 len(self.text[call.args_start:i].rstrip()))

    def _string_done(self, literal: str) -> None:
        if self.depth != 2 or not self.calls:
            return
        try:
            value = json.loads(literal)
        except ValueError:
            return
        if self.value_key is None:
            self.key = value
        elif self.value_key == "name" and self.calls[-1].name is None:
            self.calls[-1].name = value

    def _emit(self) -> list[Event]:
        events: list[Event] = []
        for call in self.calls:
            if call.name is None:
                break  # calls are given out in order
            if not call.started:
                call.started = True
                events.append(("start", call.name))
            if call.args_start is None or (not call.container and call.args_end is None):
                continue
            end = call.args_end if call.args_end is not None else len(self.text)
            piece = self.text[call.args_start + call.sent:end]
            if piece:
                call.sent += len(piece)
                events.append(("args", piece))
        return events
