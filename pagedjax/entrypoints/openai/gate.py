"""The gate in front of every route (pure ASGI middleware).

In order: while draining for shutdown every request gets 503 with
``Connection: close`` (new and kept-alive connections alike); on a loopback
bind the ``Host`` header must be a loopback name or one of ``--allowed-hosts``
(stops DNS rebinding, as Jupyter does); with an API key, ``/v1``, ``/tokenize``,
``/detokenize``, ``/metrics``, ``/dashboard/events`` and the docs need
``Authorization: Bearer <key>`` or, as Anthropic clients send it, ``x-api-key: <key>``
(constant-time comparison), ``/health`` never does (nor the browser pages themselves: they
ask for the key). On the Messages routes its errors have Anthropic's shape. It also counts
the requests in progress, so shutdown knows when the last one has ended.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Optional

from pagedjax.entrypoints.openai.anthropic_errors import anthropic_error, is_messages_path
from pagedjax.entrypoints.openai.errors import OpenAIError, short

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
METRICS_PATHS = frozenset({"/metrics", "/dashboard/events"})  # --metrics-without-key opens both
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """'example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


@dataclass
class GateConfig:
    api_key: Optional[str] = None
    allowed_hosts: Optional[frozenset] = None  # None: any Host; else loopback names + these
    open_metrics: bool = False
    open_docs: bool = False


@dataclass
class ServerState:
    draining: bool = False
    active: int = 0
    exit_code: int = 0
    notes: list = field(default_factory=list)


async def send_error(send, e: OpenAIError, close: bool = False, path: str = "") -> None:
    """``e`` as a JSON response: OpenAI's shape, Anthropic's on the Messages routes."""
    shaped = anthropic_error(e.body(), e.status) if is_messages_path(path) else e.body()
    body = json.dumps(shaped).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Gate:
    def __init__(self, app, config: GateConfig, state: ServerState):
        self.app = app
        self.config = config
        self.state = state

    def _needs_key(self, path: str) -> bool:
        if not self.config.api_key or path == "/health":
            return False
        if path in METRICS_PATHS:
            return not self.config.open_metrics
        if path in DOCS_PATHS:
            return not self.config.open_docs
        return path.startswith("/v1") or path in ("/tokenize", "/detokenize", "/score",
                                                  "/rerank")

    def check(self, scope) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}
        allowed = self.config.allowed_hosts
        if allowed is not None and "host" in headers:
            name = host_name(headers["host"])
            if not (is_loopback(name) or name in allowed or "*" in allowed):
                raise OpenAIError(f"Host {short(headers['host'])} is not allowed: this server is "
                                  "bound to a loopback address; add the name to --allowed-hosts "
                                  "to serve it.", 403, code="host_not_allowed")
        if self._needs_key(scope.get("path", "")) and not self._key_ok(headers):
            raise OpenAIError("Incorrect or missing API key: send 'Authorization: Bearer "
                              "<key>' or 'x-api-key: <key>'.", 401, code="invalid_api_key")

    def _key_ok(self, headers: dict) -> bool:
        """The bearer token or the ``x-api-key`` header (Anthropic clients) is the key."""
        key = self.config.api_key.encode()
        scheme, _, token = headers.get("authorization", "").partition(" ")
        tokens = [token] if scheme.lower() == "bearer" else []
        if "x-api-key" in headers:
            tokens.append(headers["x-api-key"])
        ok = False
        for t in tokens:  # compare every one: no early exit on a match
            ok |= hmac.compare_digest(t.strip().encode("utf-8", "replace"), key)
        return ok

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.state.draining:
            return await send_error(send, OpenAIError(
                "the server is shutting down; retry on another replica.", 503,
                type="server_error", code="service_unavailable"), close=True,
                path=scope.get("path", ""))
        try:
            self.check(scope)
        except OpenAIError as e:
            return await send_error(send, e, path=scope.get("path", ""))
        self.state.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.active -= 1
