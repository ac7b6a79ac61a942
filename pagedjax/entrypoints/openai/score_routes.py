"""Routes of the pooling endpoints, registered by ``app.build_app``: ``/v1/embeddings``,
``/score`` and ``/rerank`` (and their ``/v1`` names); errors in OpenAI's shape, as
vLLM answers them."""

from __future__ import annotations

from fastapi import FastAPI, Request

from pagedjax.entrypoints.openai.serving_embedding import (EmbeddingRequest,
                                                           EmbeddingResponse, EmbeddingServing)
from pagedjax.entrypoints.openai.serving_score import (RerankRequest, RerankResponse,
                                                       ScoreRequest, ScoreResponse,
                                                       ScoreServing)


def add_score_routes(app: FastAPI, serving, handle, body_schema, post_errors: dict,
                     pooling: str = "last") -> None:
    ss = ScoreServing(serving)
    es = EmbeddingServing(serving, pooling)

    @app.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingRequest),
              responses={200: {"model": EmbeddingResponse}, **post_errors})
    async def embeddings(request: Request):
        return await handle(request, EmbeddingRequest, es.create)

    for path in ("/score", "/v1/score"):
        @app.post(path, openapi_extra=body_schema(ScoreRequest),
                  operation_id="score_" + path.strip("/").replace("/", "_"),
                  responses={200: {"model": ScoreResponse}, **post_errors})
        async def score(request: Request):
            return await handle(request, ScoreRequest, ss.score)

    for path in ("/rerank", "/v1/rerank"):
        @app.post(path, openapi_extra=body_schema(RerankRequest),
                  operation_id="rerank_" + path.strip("/").replace("/", "_"),
                  responses={200: {"model": RerankResponse}, **post_errors})
        async def rerank(request: Request):
            return await handle(request, RerankRequest, ss.rerank)
