"""The route of the Anthropic Messages API, ``POST /v1/messages`` (registered by
``app.build_app``); its errors in Anthropic's shape."""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from pagedjax.entrypoints.openai.protocol_messages import (AnthropicError, MessagesRequest,
                                                           MessagesResponse)
from pagedjax.entrypoints.openai.anthropic_errors import anthropic_error
from pagedjax.entrypoints.openai.serving_messages import MessagesServing

_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON event"},
                   "event": {"type": "string"}}}}}
_WHAT = {400: "Invalid request.", 401: "Missing or wrong API key.", 403: "Host not allowed.",
         404: "Unknown model.", 413: "Request body too large.", 415: "The body is not JSON.",
         500: "The engine failed on this request.", 503: "The server is shutting down."}


def add_messages_routes(app: FastAPI, serving, handle, body_schema) -> None:
    ms = MessagesServing(serving)
    errors = {c: {"model": AnthropicError, "description": d} for c, d in _WHAT.items()}

    @app.post("/v1/messages", openapi_extra=body_schema(MessagesRequest),
              responses={200: {"model": MessagesResponse, "content": _SSE}, **errors})
    async def create_message(request: Request):
        resp = await handle(request, MessagesRequest, ms.create)
        if isinstance(resp, JSONResponse) and resp.status_code >= 400:
            body = anthropic_error(json.loads(resp.body), resp.status_code)
            return JSONResponse(body, status_code=resp.status_code)
        return resp
