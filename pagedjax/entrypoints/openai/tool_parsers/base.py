"""What every tool parser is: a machine fed the model's text piece by piece.

A parser turns text into events, in order:

* ``("content", text)``: plain assistant text;
* ``("start", name)``: a new tool call to ``name`` begins;
* ``("args", text)``: more of the current call's ``arguments`` (a JSON string
  once all its pieces are joined).

``feed`` may hold text back while it could still be the start of a call, so a
stream never shows a half-written ``<tool_call>`` as content; ``finish`` gives
out whatever is left. The same machine serves streaming (fed each delta) and
non-streaming responses (fed the whole text once), so both agree. Text that
does not parse as a call is given out as content: a parser never raises on
model output.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pagedjax.entrypoints.text_tags import held_back  # noqa: F401 - the parsers' helper

Event = tuple[str, str]


class ToolParser:
    """Base class; subclasses implement ``feed`` and ``finish``."""

    name = "base"

    def feed(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError

    def parse(self, text: str) -> list[Event]:
        """All events of a complete output."""
        return self.feed(text) + self.finish()


def call_events(obj: Any, arg_keys: tuple[str, ...]) -> Optional[list[Event]]:
    """Events of one parsed call ``{"name": str, <arg key>: object}``, or None if
    ``obj`` is not a call. Arguments given as a JSON string are kept as written."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args: Any = {}
    for k in arg_keys:
        if k in obj:
            args = obj[k]
            break
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        text = args
    elif isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return [("start", obj["name"]), ("args", text)]
