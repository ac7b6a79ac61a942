"""A Responses request as the chat request it amounts to.

* ``input`` (text, or a list of items) becomes chat messages: a message item
  ``{role, content}`` (content text or ``input_text`` / ``output_text`` parts;
  ``developer`` is read as ``system``), a ``function_call`` item becomes an
  assistant message's tool call, a ``function_call_output`` a ``tool`` message;
  ``reasoning`` items are skipped (the template does not take them back).
* ``instructions`` is a system message in front (not carried over to a
  follow-up, as OpenAI documents); ``previous_response_id``'s stored
  conversation comes before the new input.
* function tools, ``tool_choice``, ``text.format`` and ``max_output_tokens``
  map to their chat fields.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pagedjax.entrypoints.openai.errors import OpenAIError, short
from pagedjax.entrypoints.openai.protocol import ChatCompletionRequest
from pagedjax.entrypoints.openai.protocol_responses import ResponsesRequest

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# chat field named in an error -> the Responses field the client sent
PARAM_NAMES = {"messages": "input", "max_tokens": "max_output_tokens",
               "response_format": "text", "tools": "tools", "tool_choice": "tool_choice"}


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(f"{where}.content must be text or a list of text parts.", 400,
                          param="input")
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text",
                                                                   "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise OpenAIError(f"{where}: content parts of type {short(kind)} are not supported "
                              "(input_text and output_text only).", 400, param="input")
        text = part.get("text")
        if not isinstance(text, str):
            raise OpenAIError(f"{where}: a text part needs a 'text' string.", 400, param="input")
        parts.append(text)
    return "".join(parts)


def _str_field(item: dict, key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str) or not v:
        raise OpenAIError(f"{where} needs a non-empty string '{key}'.", 400, param="input")
    return v


def _call_item(item: dict, where: str) -> dict:
    args = item.get("arguments", "{}")
    if not isinstance(args, str):
        raise OpenAIError(f"{where}.arguments must be a JSON string.", 400, param="input")
    return {"id": _str_field(item, "call_id", where), "type": "function",
            "function": {"name": _str_field(item, "name", where), "arguments": args}}


def input_messages(inp: Any) -> list[dict]:
    """The request's ``input`` as chat messages; OpenAIError 400 for an item it cannot be."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    messages: list[dict] = []
    for i, item in enumerate(inp):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
            if role is None:
                raise OpenAIError(f"{where}.role must be one of {sorted(ROLES)}.", 400,
                                  param="input")
            messages.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            call = _call_item(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            if not isinstance(out, str):
                out = json.dumps(out) if isinstance(out, (list, dict)) else None
            if out is None:
                raise OpenAIError(f"{where}.output must be a string.", 400, param="input")
            messages.append({"role": "tool", "tool_call_id": _str_field(item, "call_id", where),
                             "content": out})
        elif kind != "reasoning":
            raise OpenAIError(f"{where}: items of type {short(kind)} are not supported (message, "
                              "function_call, function_call_output, reasoning).", 400,
                              param="input")
    if not any(m["role"] != "assistant" for m in messages):
        raise OpenAIError("input needs at least one message.", 400, param="input")
    return messages


def output_message(output: list[dict]) -> Optional[dict]:
    """A response's output items as the assistant message a follow-up starts from."""
    text = "".join(part.get("text", "") for item in output if item.get("type") == "message"
                   for part in item.get("content", []))
    calls = [{"id": it["call_id"], "type": "function",
              "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in output if it.get("type") == "function_call"]
    if not text and not calls:
        return None
    msg: dict = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _response_format(req: ResponsesRequest) -> Optional[dict]:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    js = {"name": fmt.name or "response", "schema": fmt.json_schema, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": {k: v for k, v in js.items() if v is not None}}


def chat_request(req: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request for these messages with the Responses request's settings."""
    tools = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
             for t in req.tools or []] or None
    choice = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        choice = {"type": "function", "function": {"name": choice.name}}
    body = dict(model=req.model, messages=messages, max_tokens=req.max_output_tokens,
                temperature=req.temperature, top_p=req.top_p, seed=req.seed, tools=tools,
                tool_choice=choice, parallel_tool_calls=req.parallel_tool_calls,
                response_format=_response_format(req), stream=req.stream,
                chat_template_kwargs=req.chat_template_kwargs)
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
