"""The FastAPI application: routes, the OpenAPI document, error shapes.

Request bodies are read and checked by ``request_body`` (in AsyncLLM's worker
pool: parsing a 4 MB body is CPU work), then handed to ``OpenAIServing``.
The OpenAPI document declares the request bodies and responses from the
pydantic models, with every error status a route can answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from pagedjax.engine.async_llm import AsyncLLM, EngineDeadError, EngineStepError
from pagedjax.entrypoints.openai import request_body as rb
from pagedjax.entrypoints.openai import responses as R
from pagedjax.entrypoints.openai.anthropic_errors import anthropic_error, is_messages_path
from pagedjax.entrypoints.openai.chat_render import DEFAULT_TIME_LIMIT_S
from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.gate import Gate, GateConfig, ServerState
from pagedjax.entrypoints.openai.jobs import ClientDisconnected, engine_error
from pagedjax.entrypoints.openai.lora_routes import LoRARegistry, add_lora_routes
from pagedjax.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                  DetokenizeRequest, ModelCard, TokenizeRequest)
from pagedjax.entrypoints.openai.serving import OpenAIServing
from pagedjax.entrypoints.openai.serving_tokenize import TokenizeServing

logger = logging.getLogger("pagedjax.server")

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
_POST_ERRORS = R.error_responses(400, 401, 403, 404, 413, 415, 500, 503)
# With stream=true: server-sent events, each ``data`` a JSON chunk (or an error
# body), the last one ``[DONE]``. Before OpenAPI 3.2, ``schema`` describes one event.
_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON chunk, or [DONE]"},
                   "event": {"type": "string"}, "id": {"type": "string"}}}}}


@dataclass
class AppConfig:
    served_model_names: list[str]
    gate: GateConfig = field(default_factory=GateConfig)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_logprobs: int = 20
    template_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    allowed_origins: Optional[list[str]] = None
    enable_test_hooks: bool = False
    metrics: object = None
    lora_registry: object = None  # lora_routes.LoRARegistry (adapters served as models)
    allow_lora_updates: bool = False  # /v1/load_lora_adapter and /v1/unload_lora_adapter
    lora_allowed_paths: tuple = ()  # resolved folders runtime loading may read from
    tool_call_parser: Optional[str] = None  # tool_choice "auto" answered with this parser
    live_stats: object = None  # engine.live_stats.LiveStats: the browser pages (None: no pages)
    reasoning_parser: Optional[str] = None  # <think> blocks -> reasoning_content
    response_store: object = None  # responses_store.ResponseStore (/v1/responses)
    pooling_type: str = "last"  # /v1/embeddings: last-token or mean pooling


def _body_schema(model_cls) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model_cls.__name__}"}}}}}


def _parse(raw: bytes, model_cls):
    return rb.validate(model_cls, rb.parse_json(raw))


def build_app(llm: AsyncLLM, config: AppConfig, state: Optional[ServerState] = None) -> FastAPI:
    import pagedjax

    app = FastAPI(title="pagedjax OpenAI-compatible server", version=pagedjax.__version__)
    state = state or ServerState()
    serving = OpenAIServing(llm, config.served_model_names, config.max_logprobs,
                            config.template_time_limit_s, config.tool_call_parser,
                            config.reasoning_parser)
    app.state.llm, app.state.serving, app.state.server = llm, serving, state
    engine = llm.engine
    loras = config.lora_registry or LoRARegistry(config.served_model_names[0],
                                                 tuple(config.served_model_names))
    serving.loras = loras
    add_lora_routes(app, llm, loras, config.allow_lora_updates and engine.lora is not None,
                    config.lora_allowed_paths)

    def error(e: OpenAIError, path: str = "") -> JSONResponse:
        body = anthropic_error(e.body(), e.status) if is_messages_path(path) else e.body()
        return JSONResponse(body, status_code=e.status)

    async def handle(request: Request, model_cls, method):
        try:
            rb.check_content_type(request.headers.get("content-type"))
            raw = await rb.read_body(request, config.max_body_bytes)
            req = await llm.run_in_worker(_parse, raw, model_cls)
            fault = request.headers.get("x-pagedjax-test-fault") if config.enable_test_hooks \
                else None
            if fault in ("step", "thread"):
                llm.inject_step_fault(fault)
            result = await method(req, request)
        except OpenAIError as e:
            return error(e)
        except (ClientDisconnected, ClientDisconnect):  # gone, or its body timed out
            return Response(status_code=499)
        except (EngineDeadError, EngineStepError) as e:
            return error(engine_error(e))
        except Exception as e:  # noqa: BLE001 - never let a request take the server down
            logger.exception("unhandled error")
            return error(OpenAIError(f"internal server error: {type(e).__name__}", 500,
                                     type="server_error"))
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.exception_handler(404)
    async def not_found(request, exc):  # unknown routes: OpenAI shape too
        return error(OpenAIError(f"no route {request.method} {request.url.path[:100]}", 404,
                                 code="not_found"), request.url.path)

    @app.exception_handler(405)
    async def bad_method(request, exc):
        return error(OpenAIError(f"method {request.method} not allowed on "
                                 f"{request.url.path[:100]}", 405, code="method_not_allowed"),
                     request.url.path)

    @app.get("/health", response_class=Response,
             responses={200: {"description": "The engine is running (empty body)."},
                        **R.error_responses(503)})
    async def health():
        if not llm.is_running:
            return error(OpenAIError("the engine thread is not running", 503, type="server_error",
                                     code="service_unavailable"))
        return Response(status_code=200)

    @app.get("/version", response_model=R.VersionResponse)
    async def version():
        return {"version": pagedjax.__version__}

    @app.get("/metrics", response_class=Response,
             responses={200: {"description": "Prometheus metrics.",
                              "content": {"text/plain": {"schema": {"type": "string"}}}},
                        **R.error_responses(401)})
    async def prom():
        from pagedjax.engine.metrics import CONTENT_TYPE_LATEST

        body = config.metrics.render() if config.metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=R.ModelList, responses=R.error_responses(401, 403))
    async def models():
        cards = [ModelCard(id=name, root=engine.model_name, max_model_len=engine.max_model_len)
                 .model_dump() for name in config.served_model_names]
        cards += loras.cards(engine.max_model_len)
        return {"object": "list", "data": cards}

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest),
              responses={200: {"model": R.CompletionResponse, "content": _SSE},
                         **_POST_ERRORS})
    async def completions(request: Request):
        return await handle(request, CompletionRequest, serving.completions)

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest),
              responses={200: {"model": R.ChatCompletionResponse, "content": _SSE},
                         **_POST_ERRORS})
    async def chat(request: Request):
        return await handle(request, ChatCompletionRequest, serving.chat)

    tok = TokenizeServing(serving)

    @app.post("/tokenize", openapi_extra=_body_schema(TokenizeRequest),
              responses={200: {"model": R.TokenizeResponse}, **_POST_ERRORS})
    async def tokenize(request: Request):
        return await handle(request, TokenizeRequest, tok.tokenize)

    @app.post("/detokenize", openapi_extra=_body_schema(DetokenizeRequest),
              responses={200: {"model": R.DetokenizeResponse}, **_POST_ERRORS})
    async def detokenize(request: Request):
        return await handle(request, DetokenizeRequest, tok.detokenize)

    from pagedjax.entrypoints.openai.responses_routes import add_responses_routes
    from pagedjax.entrypoints.openai.responses_store import ResponseStore

    add_responses_routes(app, serving, handle, config.response_store or ResponseStore(),
                         _body_schema, _POST_ERRORS)
    from pagedjax.entrypoints.openai.messages_routes import add_messages_routes

    add_messages_routes(app, serving, handle, _body_schema)
    from pagedjax.entrypoints.openai.score_routes import add_score_routes

    add_score_routes(app, serving, handle, _body_schema, _POST_ERRORS, config.pooling_type)
    if config.live_stats is not None:
        from pagedjax.entrypoints.openai.ui_routes import add_ui_routes

        add_ui_routes(app, llm, config.live_stats)
    _add_request_schemas(app)
    app.add_middleware(Gate, config=config.gate, state=state)
    if config.allowed_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=config.allowed_origins,
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key",
                                          "anthropic-version"])
    return app


def _add_request_schemas(app: FastAPI) -> None:
    """Put the request models into components/schemas of the generated document."""
    base_openapi = app.openapi

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = base_openapi()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        from pagedjax.entrypoints.openai.protocol_messages import MessagesRequest
        from pagedjax.entrypoints.openai.protocol_responses import ResponsesRequest
        from pagedjax.entrypoints.openai.serving_embedding import EmbeddingRequest
        from pagedjax.entrypoints.openai.serving_score import RerankRequest, ScoreRequest

        for cls in (CompletionRequest, ChatCompletionRequest, TokenizeRequest,
                    DetokenizeRequest, ResponsesRequest, MessagesRequest, ScoreRequest,
                    RerankRequest, EmbeddingRequest):
            s = cls.model_json_schema(ref_template="#/components/schemas/{model}",
                                      mode="validation")
            schemas.update(s.pop("$defs", {}))
            schemas[cls.__name__] = s
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
