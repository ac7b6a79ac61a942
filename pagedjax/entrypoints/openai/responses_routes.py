"""Routes of the Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{response_id}`` (registered by ``app.build_app``)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from pagedjax.entrypoints.openai import responses as R
from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.protocol_responses import (DeletedResponse, ResponseObject,
                                                            ResponsesRequest)
from pagedjax.entrypoints.openai.responses_store import ResponseStore
from pagedjax.entrypoints.openai.serving_responses import ResponsesServing

# The events of a streamed response: ``event: <type>`` and ``data: <JSON event>``.
_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON event"},
                   "event": {"type": "string"}}}}}


def add_responses_routes(app: FastAPI, serving, handle, store: ResponseStore,
                         body_schema, post_errors: dict) -> None:
    rs = ResponsesServing(serving, store)
    app.state.responses = rs

    def answer(fn, response_id: str):
        try:
            return JSONResponse(fn(response_id[:256]))
        except OpenAIError as e:
            return JSONResponse(e.body(), status_code=e.status)

    @app.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest),
              responses={200: {"model": ResponseObject, "content": _SSE}, **post_errors})
    async def create_response(request: Request):
        return await handle(request, ResponsesRequest, rs.create)

    @app.get("/v1/responses/{response_id}", response_model=ResponseObject,
             responses=R.error_responses(401, 403, 404))
    async def get_response(response_id: str):
        return answer(rs.retrieve, response_id)

    @app.delete("/v1/responses/{response_id}", response_model=DeletedResponse,
                responses=R.error_responses(401, 403, 404))
    async def delete_response(response_id: str):
        return answer(rs.delete, response_id)
