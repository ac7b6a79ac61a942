"""Anthropic Messages requests as chat requests, and chat results as Messages.

* ``system`` (text or text blocks) is a system message in front;
* a message's content is text or blocks: ``text``; ``tool_use`` (an assistant's
  call: ``{id, name, input}``) becomes a chat tool call; ``tool_result``
  (``{tool_use_id, content}``) a ``tool`` message; other blocks (images) are a 400;
* ``tools`` (``{name, description, input_schema}``) and ``tool_choice``
  (``auto``, ``any`` = required, ``tool`` = named, ``none``;
  ``disable_parallel_tool_use``) map to their chat fields;
* ``stop_reason``: ``end_turn``, ``max_tokens``, ``stop_sequence`` or ``tool_use``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pagedjax.entrypoints.openai.errors import OpenAIError, short
from pagedjax.entrypoints.openai.protocol import ChatCompletionRequest
from pagedjax.entrypoints.openai.protocol_messages import MessagesRequest


def _block_text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or \
            not isinstance(block.get("text"), str):
        raise OpenAIError(f"{where}: expected a text block {{'type': 'text', 'text': ...}}.", 400,
                          param="messages")
    return block["text"]


def _result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_block_text(b, where) for b in content)
    raise OpenAIError(f"{where}.content must be text or text blocks.", 400, param="messages")


def _message(role: str, content: Any, where: str) -> list[dict]:
    """One Anthropic message as chat messages (tool results become tool messages)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    text, calls, results = [], [], []
    for j, b in enumerate(content):
        w = f"{where}.content[{j}]"
        kind = b.get("type")
        if kind == "text":
            text.append(_block_text(b, w))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or \
                    not isinstance(b.get("input", {}), dict):
                raise OpenAIError(f"{w}: tool_use needs id, name and an input object.", 400,
                                  param="messages")
            calls.append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": json.dumps(b.get("input", {}))}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise OpenAIError(f"{w}: tool_result needs a tool_use_id.", 400, param="messages")
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": _result_text(b.get("content"), w)})
        else:
            raise OpenAIError(f"{w}: blocks of type {short(kind)} are not supported in a "
                              f"{role} message (text, tool_use, tool_result).", 400,
                              param="messages")
    out = list(results)
    if text or calls or not results:
        msg: dict = {"role": role, "content": "".join(text)}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    messages: list[dict] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else \
            "".join(_block_text(b, f"system[{i}]") for i, b in enumerate(req.system))
        messages.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        messages += _message(m.role, m.content, f"messages[{i}]")
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.input_schema}}
             for t in req.tools or []] or None
    choice, parallel = None, None
    tc = req.tool_choice
    if tc is not None:
        if tc.type == "tool" and not tc.name:
            raise OpenAIError("tool_choice of type 'tool' needs a name.", 400,
                              param="tool_choice")
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(tc.type) or \
            {"type": "function", "function": {"name": tc.name}}
        parallel = False if tc.disable_parallel_tool_use else None
    body = dict(model=req.model, messages=messages, max_tokens=req.max_tokens,
                temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                stop=req.stop_sequences, tools=tools, tool_choice=choice,
                parallel_tool_calls=parallel, stream=req.stream)
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


def stop_reason(finish: Optional[str], stop: Any) -> tuple[Optional[str], Optional[str]]:
    """(Anthropic stop_reason, stop_sequence) of a chat finish reason."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "stop" and isinstance(stop, str):
        return "stop_sequence", stop
    return ("end_turn", None) if finish is not None else (None, None)


def tool_use_block(call: dict) -> dict:
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": args if isinstance(args, dict) else {}}


def message_body(result: dict, message_id: str) -> dict:
    choice = result["choices"][0]
    msg = choice["message"]
    content: list[dict] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"],
                        "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    content += [tool_use_block(c) for c in msg.get("tool_calls") or []]
    reason, seq = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"))
    u = result.get("usage") or {}
    return {"id": message_id, "type": "message", "role": "assistant", "model": result["model"],
            "content": content, "stop_reason": reason, "stop_sequence": seq,
            "usage": {"input_tokens": u.get("prompt_tokens", 0),
                      "output_tokens": u.get("completion_tokens", 0)}}
