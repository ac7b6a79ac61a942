"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Messages never echo a client's value in full: ``short()`` quotes at most a
short prefix, and ``OpenAIError`` cuts any message to ``MAX_MESSAGE_CHARS``,
so a 3 MB bad value gets a small answer.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from pagedjax import arguments

MAX_MESSAGE_CHARS = 1000
MAX_QUOTE_CHARS = 40

# SamplingParams messages start with the field name ("top_p must be ...").
_FIELD_RE = re.compile(r"^([a-z_]+) ")


def short(value: Any, limit: int = MAX_QUOTE_CHARS) -> str:
    """A client's value quoted for an error message (``pagedjax.arguments.short``, cut
    shorter)."""
    return arguments.short(value, limit)


def param_of(message: str, aliases: Optional[dict] = None) -> Optional[str]:
    """The field a SamplingParams message names, renamed by ``aliases`` (e.g. chat's
    ``logprobs`` count is the request's ``top_logprobs``)."""
    m = _FIELD_RE.match(message)
    if not m:
        return None
    return (aliases or {}).get(m.group(1), m.group(1))


class OpenAIError(Exception):
    """An error with OpenAI's JSON shape and an HTTP status."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "... (message cut)"
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}
