"""``pagedjax run-batch``: OpenAI batch files, offline.

    pagedjax run-batch -i requests.jsonl -o results.jsonl [--model M ...engine options]

Each input line is a request of OpenAI's batch format::

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

(``url``: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, and
vLLM's ``/score`` and ``/rerank``, also under ``/v1`` and ``/v2/rerank``; the
embeddings pool with ``--pooling-type``). Every line gets one output line, in
input order::

    {"id": "batch_req_..", "custom_id": "r1",
     "response": {"status_code": 200, "request_id": "..", "body": {...}}, "error": null}

A request the server would refuse gets its status code and the OpenAI error
body in ``response``; a line that is not a request at all (bad JSON, no
``custom_id``, an unknown ``url``) gets ``"response": null`` and an ``error``
``{"code", "message"}``. Either way the other lines go on. The requests run
through the server's own code (:class:`OpenAIServing`) on one engine, all
submitted at once, so they share the continuous batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any, Optional

from pagedjax.entrypoints.openai import request_body as rb
from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from pagedjax.entrypoints.openai.serving_embedding import EmbeddingRequest, EmbeddingServing
from pagedjax.entrypoints.openai.serving_score import (RerankRequest, ScoreRequest,
                                                       ScoreServing)

# url -> (request model, the handler's name in BatchHandlers)
ROUTES = {"/v1/chat/completions": (ChatCompletionRequest, "chat"),
          "/v1/completions": (CompletionRequest, "completions"),
          "/v1/embeddings": (EmbeddingRequest, "embeddings"),
          "/score": (ScoreRequest, "score"), "/v1/score": (ScoreRequest, "score"),
          "/rerank": (RerankRequest, "rerank"), "/v1/rerank": (RerankRequest, "rerank"),
          "/v2/rerank": (RerankRequest, "rerank")}


class BatchHandlers:
    """The server's handlers of every batch route, on one ``OpenAIServing``."""

    def __init__(self, serving, pooling: str = "last"):
        self.llm = serving.llm
        self.chat, self.completions = serving.chat, serving.completions
        self.embeddings = EmbeddingServing(serving, pooling).create
        scores = ScoreServing(serving)
        self.score, self.rerank = scores.score, scores.rerank


def _line_error(custom_id: Any, code: str, message: str) -> dict:
    return {"id": f"batch_req_{uuid.uuid4().hex}",
            "custom_id": custom_id if isinstance(custom_id, str) else None,
            "response": None, "error": {"code": code, "message": message[:1000]}}


def parse_line(line: str, n: int):
    """(custom_id, url, request model) of one input line, or an output line (error)."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        return _line_error(None, "invalid_json", f"line {n}: not JSON: {e}")
    if not isinstance(obj, dict):
        return _line_error(None, "invalid_request", f"line {n}: a request is a JSON object")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return _line_error(cid, "invalid_request", f"line {n}: 'custom_id' must be a string")
    if obj.get("method", "POST") != "POST":
        return _line_error(cid, "invalid_request", f"line {n}: 'method' must be POST")
    url = obj.get("url")
    if url not in ROUTES:
        return _line_error(cid, "invalid_url", f"line {n}: 'url' must be one of {sorted(ROUTES)}"
                           f", got {str(url)[:60]!r}")
    if not isinstance(obj.get("body"), dict):
        return _line_error(cid, "invalid_request", f"line {n}: 'body' must be a JSON object")
    return cid, url, obj["body"]


async def _one(handlers: BatchHandlers, cid: str, url: str, body: dict) -> dict:
    model_cls, method = ROUTES[url]
    rid = f"batch_req_{uuid.uuid4().hex}"
    try:
        if body.get("stream"):
            raise OpenAIError("stream is not supported in a batch file.", 400, param="stream")
        req = await handlers.llm.run_in_worker(rb.validate, model_cls, body)
        result = await getattr(handlers, method)(req, None)
        response = {"status_code": 200, "request_id": rid, "body": result}
    except OpenAIError as e:
        response = {"status_code": e.status, "request_id": rid, "body": e.body()}
    return {"id": rid, "custom_id": cid, "response": response, "error": None}


async def run_lines(handlers: BatchHandlers, lines: list[str]) -> list[dict]:
    """Every line's output line, in order (the requests run concurrently)."""
    async def done(value):
        return value

    jobs = []
    for n, line in enumerate(lines, 1):
        parsed = parse_line(line, n)
        jobs.append(done(parsed) if isinstance(parsed, dict) else _one(handlers, *parsed))
    return list(await asyncio.gather(*jobs))


def run_batch(ns: argparse.Namespace) -> int:
    from pagedjax.config import EngineArgs
    from pagedjax.engine.async_llm import AsyncLLM
    from pagedjax.engine.llm_engine import LLMEngine
    from pagedjax.entrypoints.openai.serving import OpenAIServing

    src = sys.stdin if ns.input_file == "-" else open(ns.input_file)
    with src:
        lines = [ln for ln in src.read().splitlines() if ln.strip()]
    engine = LLMEngine(EngineArgs.from_cli_args(ns, model=ns.model))
    llm = AsyncLLM.from_engine(engine)
    names = ns.served_model_name or [ns.model or engine.model_name]
    try:
        serving = OpenAIServing(llm, names, reasoning_parser=ns.reasoning_parser)
        outs = asyncio.run(run_lines(BatchHandlers(serving, ns.pooling_type), lines))
    finally:
        llm.shutdown()
    dst = sys.stdout if ns.output_file == "-" else open(ns.output_file, "w")
    with dst:
        for o in outs:
            dst.write(json.dumps(o, ensure_ascii=False) + "\n")
    failed = sum(o["error"] is not None or o["response"]["status_code"] != 200 for o in outs)
    print(f"run-batch: {len(outs)} requests, {failed} failed -> {ns.output_file}",
          file=sys.stderr)
    return 0


def add_cli_args(p: argparse.ArgumentParser) -> None:
    from pagedjax.config import EngineArgs
    from pagedjax.entrypoints.pooling import POOLING_TYPES
    from pagedjax.entrypoints.reasoning import REASONING_PARSERS

    p.add_argument("-i", "--input-file", required=True, help="batch file (JSONL; - for stdin)")
    p.add_argument("-o", "--output-file", required=True, help="results (JSONL; - for stdout)")
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS))
    p.add_argument("--pooling-type", default="last", choices=list(POOLING_TYPES),
                   help="how /v1/embeddings lines pool the prompt's hidden states")
    EngineArgs.add_cli_args(p)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="pagedjax run-batch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(p)
    return run_batch(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
