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
        msg, field = pydantic_message(e, body)
        raise OpenAIError(msg, 400, param=field) from None


_BRANCH_PREFIXES = ("constrained-", "list[", "dict[", "function-", "json-or-python[",
                    "lax-or-strict[", "nullable[", "tagged-union[")
_SCALAR_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def _is_branch(x) -> bool:
    """A union member's type name that pydantic puts into ``loc`` ('constrained-str')."""
    return isinstance(x, str) and (x in _SCALAR_TAGS or x.startswith(_BRANCH_PREFIXES))


def _fits(branch: str, value) -> bool:
    """The union member ``branch`` is the one meant for ``value`` (list[int] for [-1])."""
    if isinstance(value, list):
        if not branch.startswith("list["):
            return False
        return not value or _fits(branch[5:-1], value[0])
    if isinstance(value, bool):
        return branch.startswith(("bool", "constrained-bool"))
    for kind, name in ((dict, "dict"), (str, "str"), (int, "int"), (float, "float")):
        if isinstance(value, kind):
            return branch.startswith((name, f"constrained-{name}")) or (
                kind is dict and not _is_branch(branch))
    return False


def _pick(errs: list, body: Optional[dict]) -> tuple[dict, int]:
    """The error to report (for a union field: from the member meant for the value's
    type) and how many errors other fields have."""
    first = errs[0]
    field = first["loc"][0] if first.get("loc") else None
    same = [e for e in errs if e.get("loc") and e["loc"][0] == field]
    others = len(errs) - len(same)
    value = body.get(field) if isinstance(body, dict) and isinstance(field, str) else None
    for e in same:
        loc = e["loc"]
        if len(loc) > 1 and _is_branch(loc[1]) and _fits(loc[1], value):
            return e, others
    return first, others + (0 if any(len(e["loc"]) > 1 and _is_branch(e["loc"][1])
                                      for e in same) else len(same) - 1)


def pydantic_message(err: ValidationError, body: Optional[dict] = None
                     ) -> tuple[str, Optional[str]]:
    """One error, with its field path (without pydantic's union member names) and a
    short quote of the value."""
    errs = err.errors(include_url=False)
    if not errs:
        return "the request body is invalid.", None
    e, more = _pick(errs, body)
    loc = [x for x in e.get("loc", ()) if not _is_branch(x)]
    field = str(loc[0]) if loc else None
    msg = f"{'.'.join(str(x) for x in loc) or 'body'}: {e.get('msg')}"
    if "input" in e and not isinstance(e["input"], (dict, list)):
        msg += f" (got {short(e['input'])})"
    if more:
        msg += f" (and {more} more error(s))"
    return msg, field
