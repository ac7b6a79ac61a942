"""``POST /v1/messages`` (Anthropic's Messages API) on top of chat completions.

The request runs through :class:`OpenAIServing.chat` as the chat request it
amounts to (``messages_convert``); the result, or the stream of chunks, comes
back in Anthropic's shapes: ``message_start``, ``content_block_start`` /
``_delta`` (``text_delta``, ``thinking_delta``, ``input_json_delta``) /
``_stop``, ``message_delta`` (stop reason, usage) and ``message_stop``.
Errors have Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import uuid
from typing import AsyncIterator, Optional

from pydantic import ValidationError

from pagedjax.entrypoints.openai.anthropic_errors import anthropic_error
from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.messages_convert import chat_request, message_body, stop_reason
from pagedjax.entrypoints.openai.protocol_messages import MessagesRequest


def _event(kind: str, body: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(dict(type=kind, **body), ensure_ascii=False)}\n\n"


class MessagesServing:
    def __init__(self, serving):
        self.serving = serving  # OpenAIServing

    async def create(self, req: MessagesRequest, raw_request):
        try:
            chat = chat_request(req)
        except ValidationError as e:
            raise OpenAIError(f"messages do not make a valid conversation: "
                              f"{str(e.errors()[0].get('msg', ''))[:200]}", 400,
                              param="messages") from None
        result = await self.serving.chat(chat, raw_request)
        mid = f"msg_{uuid.uuid4().hex}"
        if isinstance(result, dict):
            return message_body(result, mid)
        return _Stream(mid, self.serving.check_model(req.model)).run(result)


class _Stream:
    """Chat chunks -> Anthropic stream events (one choice)."""

    def __init__(self, mid: str, model: str):
        self.mid, self.model = mid, model
        self.index = -1
        self.kind: Optional[str] = None  # the open block: text, thinking or tool_use
        self.finish = self.stop = None
        self.usage = {"input_tokens": 0, "output_tokens": 0}

    def _open(self, block: dict) -> list[str]:
        out = self._close()
        self.index += 1
        self.kind = block["type"]
        return out + [_event("content_block_start", {"index": self.index,
                                                     "content_block": block})]

    def _close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [_event("content_block_stop", {"index": self.index})]

    def _delta(self, kind: str, block: dict, delta: dict) -> list[str]:
        out = self._open(block) if self.kind != kind else []
        return out + [_event("content_block_delta", {"index": self.index, "delta": delta})]

    def chunk(self, chunk: dict) -> list[str]:
        if chunk.get("usage"):
            self.usage = {"input_tokens": chunk["usage"]["prompt_tokens"],
                          "output_tokens": chunk["usage"]["completion_tokens"]}
        out: list[str] = []
        for choice in chunk.get("choices") or []:
            d = choice.get("delta") or {}
            if d.get("reasoning_content"):
                out += self._delta("thinking", {"type": "thinking", "thinking": "",
                                                "signature": ""},
                                   {"type": "thinking_delta", "thinking": d["reasoning_content"]})
            if d.get("content"):
                out += self._delta("text", {"type": "text", "text": ""},
                                   {"type": "text_delta", "text": d["content"]})
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if tc.get("id"):
                    out += self._open({"type": "tool_use", "id": tc["id"],
                                       "name": fn.get("name", ""), "input": {}})
                if fn.get("arguments") and self.kind == "tool_use":
                    out.append(_event("content_block_delta", {"index": self.index, "delta": {
                        "type": "input_json_delta", "partial_json": fn["arguments"]}}))
            if choice.get("finish_reason"):
                self.finish, self.stop = choice["finish_reason"], choice.get("stop_reason")
        return out

    async def run(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        yield _event("message_start", {"message": {
            "id": self.mid, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})
        try:
            async for line in chunks:
                data = line[len("data: "):].strip() if line.startswith("data: ") else ""
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    yield _event("error", {"error": anthropic_error(chunk, 500)["error"]})
                    return
                for e in self.chunk(chunk):
                    yield e
        finally:
            await chunks.aclose()
        for e in self._close():
            yield e
        reason, seq = stop_reason(self.finish, self.stop)
        yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                       "usage": self.usage})
        yield _event("message_stop", {})
