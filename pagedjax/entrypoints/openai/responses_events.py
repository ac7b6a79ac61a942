"""Chat completion results and chunks as Responses output items and stream events.

:func:`output_items` turns a chat choice's message into Responses items
(``reasoning``, ``message`` with ``output_text``, ``function_call``).
:class:`EventWriter` follows a chat stream's deltas and writes the Responses
events: ``response.output_item.added`` / ``.done`` around each item,
``response.content_part.added`` / ``.done`` around its text,
``response.reasoning_text.delta``, ``response.output_text.delta`` and
``response.function_call_arguments.delta`` (each with its ``.done``), every
event numbered by ``sequence_number``.
"""

from __future__ import annotations

import json
import uuid
from typing import Optional


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(text: str, status: str = "completed", iid: Optional[str] = None) -> dict:
    return {"id": iid or item_id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str, status: str = "completed", iid: Optional[str] = None) -> dict:
    return {"id": iid or item_id("msg"), "type": "message", "role": "assistant",
            "status": status, "content": [text_part(text)]}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed",
              iid: Optional[str] = None) -> dict:
    return {"id": iid or item_id("fc"), "type": "function_call", "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def output_items(message: dict) -> list[dict]:
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(message["content"]))
    for tc in message.get("tool_calls") or []:
        items.append(call_item(tc["id"], tc["function"]["name"], tc["function"]["arguments"]))
    return items


def usage(chat_usage: Optional[dict]) -> Optional[dict]:
    if not chat_usage:
        return None
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def finish(response: dict, finish_reason: Optional[str]) -> dict:
    """``status`` (and ``incomplete_details``) from the chat finish reason."""
    if finish_reason == "length":
        response.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    else:
        response.update(status="completed", incomplete_details=None)
    return response


class EventWriter:
    """Chat chunks in, Responses SSE events out (one response, one choice)."""

    def __init__(self, response: dict):
        self.response = response
        self.seq = 0
        self.output: list[dict] = []
        self.current: Optional[dict] = None  # the open item
        self.text = ""  # its text or arguments so far
        self.finish_reason: Optional[str] = None
        self.usage: Optional[dict] = None

    def event(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        snapshot = dict(self.response, status="in_progress", output=[])
        return [self.event("response.created", response=snapshot),
                self.event("response.in_progress", response=snapshot)]

    # ------------------------------------------------------------------ items
    def _open(self, item: dict) -> list[str]:
        out = self._close()
        self.current, self.text = item, ""
        idx = len(self.output)
        out.append(self.event("response.output_item.added", output_index=idx, item=item))
        part = {"reasoning": {"type": "reasoning_text", "text": ""},
                "message": text_part("")}.get(item["type"])
        if part is not None:
            out.append(self.event("response.content_part.added", item_id=item["id"],
                                  output_index=idx, content_index=0, part=part))
        return out

    def _close(self) -> list[str]:
        item, out = self.current, []
        if item is None:
            return out
        idx, iid, text = len(self.output), item["id"], self.text
        if item["type"] == "reasoning":
            done = reasoning_item(text, iid=iid)
            out.append(self.event("response.reasoning_text.done", item_id=iid, output_index=idx,
                                  content_index=0, text=text))
            out.append(self.event("response.content_part.done", item_id=iid, output_index=idx,
                                  content_index=0, part=done["content"][0]))
        elif item["type"] == "message":
            done = message_item(text, iid=iid)
            out.append(self.event("response.output_text.done", item_id=iid, output_index=idx,
                                  content_index=0, text=text, logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=iid, output_index=idx,
                                  content_index=0, part=done["content"][0]))
        else:
            done = call_item(item["call_id"], item["name"], text, iid=iid)
            out.append(self.event("response.function_call_arguments.done", item_id=iid,
                                  output_index=idx, name=item["name"], arguments=text))
        out.append(self.event("response.output_item.done", output_index=idx, item=done))
        self.output.append(done)
        self.current = None
        return out

    # ------------------------------------------------------------------ chunks
    def chunk(self, chunk: dict) -> list[str]:
        """The events of one chat chunk."""
        if chunk.get("usage"):
            self.usage = usage(chunk["usage"])
        out: list[str] = []
        for choice in chunk.get("choices") or []:
            d = choice.get("delta") or {}
            if d.get("reasoning_content"):
                out += self._piece("reasoning", d["reasoning_content"])
            if d.get("content"):
                out += self._piece("message", d["content"])
            for tc in d.get("tool_calls") or []:
                out += self._call(tc)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                out += self._close()
        return out

    def _piece(self, kind: str, text: str) -> list[str]:
        out = []
        if self.current is None or self.current["type"] != kind:
            item = reasoning_item("", "in_progress") if kind == "reasoning" else \
                dict(message_item("", "in_progress"), content=[])
            out += self._open(item)
        self.text += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else \
            "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self.event(name, item_id=self.current["id"], output_index=len(self.output),
                              content_index=0, delta=text, **extra))
        return out

    def _call(self, tc: dict) -> list[str]:
        out = []
        fn = tc.get("function") or {}
        if tc.get("id"):
            out += self._open(call_item(tc["id"], fn.get("name", ""), "", "in_progress"))
        args = fn.get("arguments") or ""
        if args and self.current is not None and self.current["type"] == "function_call":
            self.text += args
            out.append(self.event("response.function_call_arguments.delta",
                                  item_id=self.current["id"], output_index=len(self.output),
                                  delta=args))
        return out

    def end(self) -> tuple[dict, list[str]]:
        """(the final response, its last events)."""
        out = self._close()
        final = finish(dict(self.response, output=self.output, usage=self.usage),
                       self.finish_reason)
        kind = "response.completed" if final["status"] == "completed" else \
            "response.incomplete"
        out.append(self.event(kind, response=final))
        return final, out

    def error(self, body: dict) -> str:
        err = body.get("error") or {}
        return self.event("error", code=err.get("code"), message=err.get("message", ""),
                          param=err.get("param"))
