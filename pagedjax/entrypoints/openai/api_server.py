"""OpenAI-compatible HTTP server.

    python -m pagedjax.entrypoints.openai.api_server --model M --port 8000
    pagedjax serve [M] --port 8000

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (tools:
docs/tool_calling.md), POST /v1/responses (+ GET/DELETE /v1/responses/{id}),
POST /v1/messages, POST /v1/embeddings, POST /score, POST /rerank (docs/more_apis.md),
POST /tokenize, POST /detokenize,
GET /health, GET /version, GET /metrics, GET /openapi.json and /docs, and the
browser pages (docs/ui.md): a chat playground at / and the live engine at
/dashboard (off with --disable-ui). Binds
127.0.0.1 unless --host is given, and then answers only requests whose Host is
a loopback name (or listed in --allowed-hosts). With --api-key (or
PAGEDJAX_API_KEY / VLLM_API_KEY, which keep the key out of the process list)
/v1, /metrics and the docs need ``Authorization: Bearer <key>``; /health never
does. Errors are OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.

Shutdown: the first SIGTERM or SIGINT starts a drain. New requests, on new or
kept-alive connections, get 503; requests in flight may finish within
--shutdown-timeout seconds; what is left then ends with an error event and
``[DONE]`` (streams) or a 503; every KV page is freed and the process exits 0.
A second signal exits at once. If the engine thread dies, /health answers
503 and the process exits with status 1 so an orchestrator restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from typing import Optional

import uvicorn

from pagedjax.entrypoints.openai.app import DEFAULT_MAX_BODY_BYTES, AppConfig, build_app
from pagedjax.entrypoints.openai.gate import GateConfig, ServerState, is_loopback
from pagedjax.entrypoints.openai.lora_routes import allowed_folders
from pagedjax.entrypoints.openai.server_limits import add_reliability_args, sandbox_from_args
from pagedjax.entrypoints.openai.slow_clients import protocol_class
from pagedjax.entrypoints.openai.responses_store import ResponseStore
from pagedjax.entrypoints.openai.tool_parsers import TOOL_PARSERS
from pagedjax.entrypoints.reasoning import REASONING_PARSERS

logger = logging.getLogger("pagedjax.server")

DEATH_GRACE_S = 2.0  # /health answers 503 this long after the engine thread died


class _Server(uvicorn.Server):
    """uvicorn's server with our drain on the first signal (and no re-raised signal)."""

    def __init__(self, config: uvicorn.Config, on_signal):
        super().__init__(config)
        self._on_signal = on_signal
        self._signalled = False
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    async def startup(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._signalled or self.loop is None:  # second signal, or before start-up: now
            self.should_exit = self.force_exit = True
            return
        self._signalled = True
        self.loop.call_soon_threadsafe(self._on_signal, sig)


async def _wait_idle(state: ServerState, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while state.active > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return state.active == 0


async def drain(server: _Server, llm, state: ServerState, timeout: float,
                reason: str = "signal") -> None:
    """Refuse new requests, let in-flight ones finish, end the rest, then stop uvicorn."""
    state.draining = True
    logger.warning("shutting down (%s): %d request(s) in flight, waiting up to %g s",
                   reason, state.active, timeout)
    if not await _wait_idle(state, timeout):
        logger.warning("%d request(s) still running after %g s: ending them", state.active,
                       timeout)
    # Fails every live stream (error event + [DONE], or 503) and frees its pages.
    await asyncio.get_running_loop().run_in_executor(None, llm.shutdown)
    await _wait_idle(state, 10.0)
    server.should_exit = True


def _on_engine_death(server: _Server, llm, state: ServerState):
    def on_death(err: BaseException) -> None:  # engine thread
        state.exit_code = 1

        async def later():
            await asyncio.sleep(DEATH_GRACE_S)  # /health says 503 meanwhile
            await drain(server, llm, state, 0.0, reason="engine thread died")
        if server.loop is not None:
            server.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(later()))
    return on_death


# ---------------------------------------------------------------------- CLI
def add_server_args(p: argparse.ArgumentParser) -> None:
    from pagedjax.distributed import multihost
    from pagedjax.config import EngineArgs

    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; use 0.0.0.0 to expose)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on /v1, "
                        "/metrics and the docs "
                        "(default: $PAGEDJAX_API_KEY or $VLLM_API_KEY; the environment keeps "
                        "the key out of the process list)")
    p.add_argument("--allowed-hosts", nargs="+", default=None, metavar="NAME",
                   help="on a loopback bind, Host names accepted besides loopback names "
                        "('*' accepts any); on other binds the Host is not checked")
    p.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                   help="enable CORS for these browser origins (default: CORS off)")
    p.add_argument("--metrics-without-key", action="store_true",
                   help="serve /metrics and /dashboard/events without the API key")
    p.add_argument("--docs-without-key", action="store_true",
                   help="serve /docs, /redoc and /openapi.json without the API key")
    p.add_argument("--disable-ui", action="store_true",
                   help="serve neither the chat page (/) nor the dashboard (/dashboard)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may run after SIGTERM/SIGINT (default 30)")
    p.add_argument("--chat-template-timeout", type=float, default=1.0,
                   help="seconds a client-supplied chat_template may take to render (then 400)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) clients use (default: the --model value)")
    p.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--warmup", action="store_true",
                   help="the same as --compile-all-at-start")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--enable-test-hooks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                   help="LoRA adapters served as models (needs --enable-lora): name=path or "
                        "JSON {\"name\": .., \"path\": .., \"base_model_name\": ..}")
    p.add_argument("--allow-runtime-lora-updating", action="store_true",
                   help="answer POST /v1/load_lora_adapter and /v1/unload_lora_adapter (needs "
                        "--enable-lora; also VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)")
    p.add_argument("--allowed-lora-paths", nargs="+", default=None, metavar="DIR",
                   help="folders /v1/load_lora_adapter may load adapters from (default: none, "
                        "every runtime load is refused)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="answer tool_choice 'auto' (the default when tools are sent) by parsing "
                        "calls out of the model's text; needs --tool-call-parser")
    p.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                   help="how the model writes tool calls: hermes (<tool_call>{...}</tool_call>, "
                        "Qwen2.5) or llama3_json ({\"name\": .., \"parameters\": ..})")
    add_reliability_args(p)
    p.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS),
                   help="split a reasoning model's <think> block into reasoning_content "
                        "(qwen3, deepseek_r1); structured outputs then constrain the answer")
    p.add_argument("--pooling-type", default="last", choices=["last", "mean"],
                   help="/v1/embeddings: the last prompt token's hidden state (decoder "
                        "embedders such as Qwen3-Embedding) or the mean over the prompt")
    p.add_argument("--disable-response-store", action="store_true",
                   help="keep no /v1/responses responses (no previous_response_id, GET, DELETE)")
    p.add_argument("--max-stored-responses", type=int, default=1000,
                   help="responses kept for previous_response_id (least recently used dropped)")
    EngineArgs.add_cli_args(p)
    # The server answers its first request while the rarer programs compile.
    p.set_defaults(background_compile=True)
    multihost.add_cli_args(p)


def _app_config(ns: argparse.Namespace, names: list[str], metrics) -> AppConfig:
    api_key = ns.api_key or os.environ.get("PAGEDJAX_API_KEY") or os.environ.get("VLLM_API_KEY")
    hosts = None
    if is_loopback(ns.host):
        hosts = frozenset(h.lower() for h in (ns.allowed_hosts or ()))
    gate = GateConfig(api_key=api_key, allowed_hosts=hosts,
                      open_metrics=ns.metrics_without_key, open_docs=ns.docs_without_key)
    return AppConfig(served_model_names=names, gate=gate, max_body_bytes=ns.max_request_body_bytes,
                     max_logprobs=ns.max_logprobs, template_time_limit_s=ns.chat_template_timeout,
                     allowed_origins=ns.allowed_origins, enable_test_hooks=ns.enable_test_hooks,
                     metrics=metrics,
                     tool_call_parser=ns.tool_call_parser if ns.enable_auto_tool_choice else None,
                     reasoning_parser=ns.reasoning_parser, pooling_type=ns.pooling_type,
                     response_store=ResponseStore(ns.max_stored_responses,
                                                  enabled=not ns.disable_response_store))


def run_server(ns: argparse.Namespace) -> int:
    from pagedjax.engine.async_llm import AsyncLLM
    from pagedjax.config import EngineArgs
    from pagedjax.engine.llm_engine import LLMEngine
    from pagedjax.engine.live_stats import LiveStats, StatLoggers
    from pagedjax.engine.metrics import EngineMetrics

    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser "
                         f"(one of {sorted(TOOL_PARSERS)})")
    logging.basicConfig(level=getattr(logging, ns.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    upfront = {"compile_all_at_start": True} if ns.warmup else {}
    engine = LLMEngine(EngineArgs.from_cli_args(ns, model=ns.model, **upfront))
    sandbox_from_args(ns, engine)
    names = ns.served_model_name or [ns.model or engine.model_name]
    metrics = EngineMetrics(names[0])
    live = None if ns.disable_ui else LiveStats()
    if live is not None:
        live.on_step(engine, 0)  # the first picture, before the engine thread owns it
    llm = AsyncLLM.from_engine(engine, stat_logger=StatLoggers(metrics, live))
    metrics.update_engine(engine, 0)
    config = _app_config(ns, names, metrics)
    config.live_stats = live
    config.lora_registry, config.allow_lora_updates = lora_setup(ns, engine, names)
    config.lora_allowed_paths = allowed_folders(ns.allowed_lora_paths)
    state = ServerState()
    app = build_app(llm, config, state)
    server: _Server

    def on_signal(sig) -> None:
        asyncio.ensure_future(drain(server, llm, state, ns.shutdown_timeout))

    server = _Server(uvicorn.Config(
        app, host=ns.host, port=ns.port, log_level=ns.log_level, timeout_graceful_shutdown=5,
        lifespan="off", http=protocol_class(ns.timeout_headers, ns.timeout_body, ns.stream_stall_timeout),
        timeout_keep_alive=ns.timeout_keep_alive), on_signal)
    llm.add_dead_callback(_on_engine_death(server, llm, state))
    logger.info("serving %s on http://%s:%d (api key %s)", names[0], ns.host, ns.port,
                "required" if config.gate.api_key else "off")
    try:
        server.run()
    finally:
        llm.shutdown()
        if engine.grammars.sandbox is not None:
            engine.grammars.sandbox.close()
    held = engine.pool_stats().used
    logger.warning("stopped: %d KV page(s) held, exit status %d", held, state.exit_code)
    return state.exit_code or (1 if held else 0)


def lora_setup(ns: argparse.Namespace, engine, names: list[str]):
    """(registry of --lora-modules, runtime updates allowed); each adapter checked now."""
    from pagedjax.entrypoints.openai.lora_routes import (LoRARegistry, parse_lora_modules,
                                                         runtime_updates_allowed)

    modules = parse_lora_modules(ns.lora_modules)
    if modules and engine.lora is None:
        raise ValueError("--lora-modules needs --enable-lora")
    registry = LoRARegistry(names[0], tuple(names))
    for m in modules:
        req = registry.make(m["name"], m["path"], m["base_model_name"])
        engine.validate_lora(req)
        registry.add(req)
    return registry, runtime_updates_allowed(ns.allow_runtime_lora_updating)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedjax.entrypoints.openai.api_server",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="short name (SmolLM2-135M-Instruct, the default), HF folder, .gguf file "
                        "or hub id (org/name)")
    add_server_args(p)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    return run_server(make_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
