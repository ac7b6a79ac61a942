"""OpenAI-compatible HTTP server.

    python -m pagedjax.entrypoints.openai.api_server --model M --port 8000
    pagedjax serve [M] --port 8000

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
GET /health, GET /version, GET /metrics. Binds 127.0.0.1 unless --host is
given. With --api-key (or PAGEDJAX_API_KEY / VLLM_API_KEY) every /v1 route
needs ``Authorization: Bearer <key>``. Errors are OpenAI-shaped:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import sys
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from pagedjax.async_llm import AsyncLLM
from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.jobs import ClientDisconnected
from pagedjax.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard
from pagedjax.entrypoints.openai.serving import OpenAIServing

logger = logging.getLogger("pagedjax.server")

DEFAULT_MAX_BODY_BYTES = 4 * 2**20


def _pydantic_message(err) -> tuple[str, Optional[str]]:
    errs = err.errors()
    if not errs:
        return str(err), None
    e = errs[0]
    loc = [str(x) for x in e.get("loc", ()) if not isinstance(x, int)]
    # Union members add their type names to loc; keep the field path only.
    field = loc[0] if loc else None
    msg = f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}"
    if "input" in e and not isinstance(e["input"], (dict, list)):
        msg += f" (got {e['input']!r})"
    if len(errs) > 1:
        msg += f" (and {len(errs) - 1} more error(s))"
    return msg, field


def build_app(llm: AsyncLLM, served_model_names: list[str], api_key: Optional[str] = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, metrics=None,
              enable_test_hooks: bool = False):
    import pagedjax

    app = FastAPI(title="pagedjax OpenAI-compatible server", version=pagedjax.__version__)
    serving = OpenAIServing(llm, served_model_names)
    app.state.llm = llm
    app.state.serving = serving
    engine = llm.engine

    def error(e: OpenAIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    def check_key(request: Request) -> None:
        if not api_key:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 api_key.encode()):
            raise OpenAIError("Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                              401, param=None, code="invalid_api_key")

    async def read_json(request: Request) -> dict:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            raise OpenAIError(f"request body is larger than the limit of {max_body_bytes} bytes.",
                              413, code="request_too_large")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_body_bytes:
                raise OpenAIError(f"request body is larger than the limit of {max_body_bytes} "
                                  "bytes.", 413, code="request_too_large")
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise OpenAIError(f"the request body is not valid JSON: {e}", 400) from e
        if not isinstance(body, dict):
            raise OpenAIError("the request body must be a JSON object.", 400)
        return body

    def parse(model_cls, body: dict):
        try:
            return model_cls.model_validate(body)
        except ValidationError as e:
            msg, field = _pydantic_message(e)
            raise OpenAIError(msg, 400, param=field) from e

    async def handle(request: Request, model_cls, method):
        try:
            check_key(request)
            body = await read_json(request)
            req = parse(model_cls, body)
            fault = request.headers.get("x-pagedjax-test-fault") if enable_test_hooks else None
            if fault in ("step", "thread"):
                llm.inject_step_fault(fault)
            result = await method(req, request)
        except OpenAIError as e:
            return error(e)
        except ClientDisconnected:
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001 - never let a request take the server down
            logger.exception("unhandled error")
            return error(OpenAIError(f"internal server error: {type(e).__name__}: {e}", 500,
                                     type="server_error"))
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.exception_handler(404)
    async def not_found(request, exc):  # unknown routes: OpenAI shape too
        return error(OpenAIError(f"no route {request.method} {request.url.path}", 404,
                                 code="not_found"))

    @app.exception_handler(405)
    async def bad_method(request, exc):
        return error(OpenAIError(f"method {request.method} not allowed on {request.url.path}",
                                 405, code="method_not_allowed"))

    @app.get("/health")
    async def health():
        if not llm.is_running:
            return error(OpenAIError("the engine thread is not running", 503, type="server_error"))
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": pagedjax.__version__}

    @app.get("/metrics")
    async def prom():
        from pagedjax.metrics import CONTENT_TYPE_LATEST

        if metrics is None:
            return Response(b"", media_type=CONTENT_TYPE_LATEST)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        try:
            check_key(request)
        except OpenAIError as e:
            return error(e)
        cards = [ModelCard(id=name, root=engine.model_name, max_model_len=engine.max_model_len)
                 .model_dump() for name in served_model_names]
        return {"object": "list", "data": cards}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, CompletionRequest, serving.completions)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, ChatCompletionRequest, serving.chat)

    return app


# ---------------------------------------------------------------------- CLI
def add_server_args(p: argparse.ArgumentParser) -> None:
    from pagedjax.entrypoints.cli import add_engine_args

    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; use 0.0.0.0 to expose)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 routes "
                        "(default: $PAGEDJAX_API_KEY or $VLLM_API_KEY)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) clients use (default: the --model value)")
    p.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--warmup", action="store_true",
                   help="compile every step shape before accepting requests")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--enable-test-hooks", action="store_true", help=argparse.SUPPRESS)
    add_engine_args(p, with_model=False)


def run_server(ns: argparse.Namespace) -> int:
    import uvicorn

    from pagedjax.config import EngineArgs
    from pagedjax.engine import LLMEngine
    from pagedjax.entrypoints.cli import engine_kwargs
    from pagedjax.metrics import EngineMetrics

    logging.basicConfig(level=getattr(logging, ns.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api_key = ns.api_key or os.environ.get("PAGEDJAX_API_KEY") or os.environ.get("VLLM_API_KEY")
    engine = LLMEngine(EngineArgs(model=ns.model, **engine_kwargs(ns)))
    if ns.warmup:
        engine.runner.warmup(progress=True)
    names = ns.served_model_name or [ns.model or engine.model_name]
    metrics = EngineMetrics(names[0])
    llm = AsyncLLM.from_engine(engine, stat_logger=metrics)
    metrics.update_engine(engine, 0)
    app = build_app(llm, names, api_key=api_key, max_body_bytes=ns.max_request_body_bytes,
                    metrics=metrics, enable_test_hooks=ns.enable_test_hooks)
    app.state.serving.max_logprobs = ns.max_logprobs
    logger.info("serving %s on http://%s:%d (api key %s)", names[0], ns.host, ns.port,
                "required" if api_key else "off")
    try:
        uvicorn.run(app, host=ns.host, port=ns.port, log_level=ns.log_level,
                    timeout_graceful_shutdown=5)
    finally:
        llm.shutdown()
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedjax.entrypoints.openai.api_server",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="short name (SmolLM2-135M-Instruct, the default), HF folder or .gguf file")
    add_server_args(p)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    return run_server(make_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
