"""Reading a request body: every client mistake becomes a 4xx, never a 500.

Checked in this order, each with an OpenAI-shaped error that quotes at most a
short prefix of the offending value:

- the content type must be JSON (415) — this also stops the "simple" cross-site
  POSTs a browser sends without a preflight (text/plain, form encodings);
- the size (413), streamed so a lying Content-Length cannot get past it;
- JSON syntax, NaN/Infinity, integers beyond Python's digit limit and nesting
  deeper than Python's recursion limit (400);
- our own limits on the parsed value: nesting depth, integers outside 64 bits,
  strings that are not valid Unicode (lone UTF-16 surrogates) (400, naming the
  field);
- the pydantic model in strict mode (no "3" for 3, no true for a token id).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from pagedjax.entrypoints.openai.errors import OpenAIError, short

MAX_DEPTH = 32
INT_LIMIT = 2**64


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (use a finite number)")


def _path(parts: list) -> str:
    return ".".join(str(p) for p in parts) or "body"


def check_value(value: Any, path: list, depth: int = 0) -> None:
    """Depth, integer range and Unicode checks on a parsed JSON value."""
    if depth > MAX_DEPTH:
        raise OpenAIError(f"{_path(path)}: the JSON is nested more than {MAX_DEPTH} levels deep.",
                          400, param=str(path[0]) if path else None)
    if isinstance(value, dict):
        for k, v in value.items():
            _check_str(k, path + [k])
            check_value(v, path + [k], depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_value(v, path + [i], depth + 1)
    elif isinstance(value, str):
        _check_str(value, path)
    elif isinstance(value, int) and not isinstance(value, bool) and not (
            -INT_LIMIT < value < INT_LIMIT):
        raise OpenAIError(f"{_path(path)}: the integer is outside the 64-bit range "
                          f"(it has {len(str(abs(value)))} digits).", 400,
                          param=str(path[0]) if path else None)


def _check_str(s: str, path: list) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise OpenAIError(f"{_path(path)}: the string is not valid Unicode (a lone UTF-16 "
                          f"surrogate at character {e.start}).", 400,
                          param=str(path[0]) if path else None) from None


def check_content_type(content_type: Optional[str]) -> None:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/")
                                            and media.endswith("+json")):
        raise OpenAIError(f"the request body must be JSON: send 'Content-Type: application/json' "
                          f"(got {short(content_type or 'no content type')}).", 415,
                          code="unsupported_media_type")


async def read_body(request, max_bytes: int) -> bytes:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > max_bytes:
        raise OpenAIError(f"the request body is larger than the limit of {max_bytes} bytes.",
                          413, code="request_too_large")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise OpenAIError(f"the request body is larger than the limit of {max_bytes} "
                              "bytes.", 413, code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> dict:
    """Parse and check a JSON object body (CPU-bound: run it off the event loop)."""
    try:
        body = json.loads(raw or b"null", parse_constant=_reject_constant)
    except RecursionError:
        raise OpenAIError("the JSON is nested too deeply.", 400) from None
    except json.JSONDecodeError as e:
        raise OpenAIError(f"the request body is not valid JSON: {e.msg} at line {e.lineno} "
                          f"column {e.colno}.", 400) from None
    except (ValueError, UnicodeDecodeError) as e:  # digit limit, NaN, bad UTF-8
        raise OpenAIError(f"the request body is not valid JSON: {str(e)[:200]}", 400) from None
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object.", 400)
    check_value(body, [])
    return body


def validate(model_cls: type[BaseModel], body: dict) -> BaseModel:
    try:
        return model_cls.model_validate(body, strict=True)
    except ValidationError as e:
        msg, field = pydantic_message(e)
        raise OpenAIError(msg, 400, param=field) from None


def pydantic_message(err: ValidationError) -> tuple[str, Optional[str]]:
    """The first error, with its field path and a short quote of the value."""
    errs = err.errors(include_url=False)
    if not errs:
        return "the request body is invalid.", None
    e = errs[0]
    loc = [x for x in e.get("loc", ())]
    # Union members add their type names to loc ('prompt', 'str'); keep the field path.
    field = str(loc[0]) if loc else None
    msg = f"{'.'.join(str(x) for x in loc)}: {e.get('msg')}"
    if "input" in e and not isinstance(e["input"], (dict, list)):
        msg += f" (got {short(e['input'])})"
    if len(errs) > 1:
        msg += f" (and {len(errs) - 1} more error(s))"
    return msg, field
