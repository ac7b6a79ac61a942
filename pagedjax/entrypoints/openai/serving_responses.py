"""``POST /v1/responses`` (OpenAI's Responses API) on top of chat completions.

A request becomes the chat request it amounts to (``responses_input``), runs
through :class:`OpenAIServing.chat` (so templates, reasoning parsers, tools and
structured outputs behave the same), and its result or stream is written back
in the Responses shapes (``responses_events``). Stored responses
(``responses_store``) hold their conversation for ``previous_response_id``.
"""

from __future__ import annotations

import json
import time
from typing import AsyncIterator

from pydantic import ValidationError

from pagedjax.entrypoints.openai import responses_events as ev
from pagedjax.entrypoints.openai.errors import OpenAIError, short
from pagedjax.entrypoints.openai.protocol_responses import ResponsesRequest
from pagedjax.entrypoints.openai.responses_input import (PARAM_NAMES, chat_request,
                                                         input_messages, output_message)
from pagedjax.entrypoints.openai.responses_store import ResponseStore, StoredResponse


class ResponsesServing:
    def __init__(self, serving, store: ResponseStore):
        self.serving = serving  # OpenAIServing
        self.store = store

    # ------------------------------------------------------------------ stored
    def _stored(self, response_id: str, param: str = "response_id") -> StoredResponse:
        if not self.store.enabled:
            raise OpenAIError("the response store is off (--disable-response-store); "
                              "responses are not kept.", 404, param=param,
                              code="response_store_disabled")
        entry = self.store.get(response_id)
        if entry is None:
            raise OpenAIError(f"Response with id {short(response_id)} not found.", 404,
                              param=param, code="not_found")
        return entry

    def retrieve(self, response_id: str) -> dict:
        return self._stored(response_id).response

    def delete(self, response_id: str) -> dict:
        self._stored(response_id)
        self.store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    # ------------------------------------------------------------------ create
    async def create(self, req: ResponsesRequest, raw_request):
        prior: list[dict] = []
        if req.previous_response_id is not None:
            prior = list(self._stored(req.previous_response_id, "previous_response_id").messages)
        messages = prior + input_messages(req.input)
        head = [{"role": "system", "content": req.instructions}] if req.instructions else []
        try:
            chat = chat_request(req, head + messages)
        except ValidationError as e:
            raise OpenAIError(f"input does not make a valid conversation: "
                              f"{str(e.errors()[0].get('msg', ''))[:200]}", 400,
                              param="input") from None
        try:
            result = await self.serving.chat(chat, raw_request)
        except OpenAIError as e:
            e.param = PARAM_NAMES.get(e.param, e.param)
            raise
        base = self._base(req)
        if isinstance(result, dict):
            base["model"] = result["model"]
            choice = result["choices"][0]
            response = ev.finish(dict(base, output=ev.output_items(choice["message"]),
                                      usage=ev.usage(result.get("usage"))),
                                 choice.get("finish_reason"))
            self._keep(req, messages, response)
            return response
        return self._stream(result, req, base, messages)

    def _base(self, req: ResponsesRequest) -> dict:
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) \
            if req.text is not None and req.text.format is not None else {"type": "text"}
        choice = req.tool_choice if req.tool_choice is not None else "auto"
        return {"id": ev.item_id("resp"), "object": "response", "created_at": int(time.time()),
                "model": self.serving.check_model(req.model), "status": "in_progress",
                "output": [], "instructions": req.instructions, "error": None,
                "incomplete_details": None, "max_output_tokens": req.max_output_tokens,
                "previous_response_id": req.previous_response_id,
                "parallel_tool_calls": req.parallel_tool_calls is not False,
                "temperature": req.temperature, "top_p": req.top_p,
                "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
                "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
                "text": {"format": fmt}, "metadata": req.metadata or {},
                "store": req.store and self.store.enabled, "reasoning": None, "usage": None}

    def _keep(self, req: ResponsesRequest, messages: list[dict], response: dict) -> None:
        if not (req.store and self.store.enabled):
            return
        reply = output_message(response["output"])
        self.store.put(StoredResponse(response, messages + ([reply] if reply else [])))

    async def _stream(self, chunks: AsyncIterator[str], req, base: dict,
                      messages: list[dict]) -> AsyncIterator[str]:
        w = ev.EventWriter(base)
        for e in w.start():
            yield e
        try:
            async for line in chunks:
                data = line[len("data: "):].strip() if line.startswith("data: ") else ""
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    yield w.error(chunk)
                    return
                for e in w.chunk(chunk):
                    yield e
        finally:
            await chunks.aclose()
        final, events = w.end()
        self._keep(req, messages, final)
        for e in events:
            yield e
