"""Errors in Anthropic's shape for the Messages routes (``/v1/messages...``):
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``.

The gate (401, 403, 503), the unknown-route handlers (404, 405) and the
Messages route itself answer in this shape on those paths, so the
``anthropic`` client raises its own error classes (``AuthenticationError``,
``NotFoundError``, ``BadRequestError``...).
"""

from __future__ import annotations

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error"}
# OpenAI field names in a chat error -> the Messages request's names.
PARAM_NAMES = {"max_tokens": "max_tokens", "tool_choice": "tool_choice", "stop": "stop_sequences"}
MESSAGES_PREFIX = "/v1/messages"


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PREFIX or path.startswith(MESSAGES_PREFIX + "/")


def anthropic_error(openai_body: dict, status: int) -> dict:
    """An OpenAI-shaped error body (``{"error": {"message", "param", ...}}``) in
    Anthropic's shape; the param, if any, leads the message under its Messages name."""
    err = openai_body.get("error") or {}
    msg = err.get("message", "error")
    if err.get("param"):
        msg = f"{PARAM_NAMES.get(err['param'], err['param'])}: {msg}"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                       "message": msg}}
