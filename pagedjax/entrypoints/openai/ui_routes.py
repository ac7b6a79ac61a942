"""The browser pages: a chat playground at ``/`` and the live engine at ``/dashboard``.

The pages and their scripts ship inside the package (``static/``) and load
nothing from other sites; they call the public OpenAI routes with the API key
the user typed (kept in sessionStorage, sent as a bearer token). A strict
Content-Security-Policy allows only the server's own scripts and styles, so
even a renderer bug could not run injected markup.

``GET /dashboard/events`` streams server-sent events, one JSON object each
``interval`` seconds (default that of :class:`LiveStats`, 0.1 to 10):
``{"t": unix time, "points": [rolling points newer than the last event],
"snapshot": pool snapshot}``; ``snapshot`` is left out when it has not changed
since the previous event, and the first event carries every point still kept
(the last minutes). The gate asks for the API key on it as on ``/metrics``. It
ends when the server drains for shutdown.
"""

from __future__ import annotations

import asyncio
import json
import time
from importlib import resources
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedjax.entrypoints.openai.errors import OpenAIError

EVENTS_PATH = "/dashboard/events"
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 10.0
_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8",
          "css": "text/css; charset=utf-8", "png": "image/png", "svg": "image/svg+xml"}
_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data: blob:; connect-src 'self'; "
                                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def load_static() -> dict[str, tuple[bytes, str]]:
    """{file name: (bytes, content type)} of the shipped static folder."""
    folder = resources.files("pagedjax.entrypoints.openai") / "static"
    files = {}
    for item in folder.iterdir():
        ext = item.name.rsplit(".", 1)[-1]
        if item.is_file() and ext in _TYPES:
            files[item.name] = (item.read_bytes(), _TYPES[ext])
    return files


def _interval(request: Request, default: float) -> float:
    raw = request.query_params.get("interval")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise OpenAIError(f"interval must be a number of seconds between {MIN_INTERVAL_S} and "
                          f"{MAX_INTERVAL_S}, got {raw[:40]!r}", 400, param="interval")
    return value


async def _fresh(live, since: float, timeout: float = 2.0) -> None:
    """Wait (briefly) until the snapshot is one built after ``since``: while the engine
    is busy, snapshots are built only for watchers, so the one kept may be old. An idle
    engine's snapshot is current."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = live.latest()[0]
        if snap is None or live.idle or snap["time"] >= since:
            return
        await asyncio.sleep(0.02)


async def snapshot_events(live, interval: float, stopped) -> AsyncIterator[bytes]:
    """The event stream of one viewer (see the module doc)."""
    with live.watch():
        await _fresh(live, time.time())
        sent_snapshot, after = None, 0
        while not stopped():
            snap, points, after_new = live.latest(after)
            event: dict = {"t": time.time(), "points": points}
            if snap is not None and snap is not sent_snapshot:
                event["snapshot"] = snap
                sent_snapshot = snap
            after = after_new
            yield b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
            await asyncio.sleep(interval)


def add_ui_routes(app: FastAPI, llm, live) -> None:
    """``/``, ``/dashboard``, ``/ui/<file>`` and the events route (see the module doc)."""
    files = load_static()
    server = app.state.server

    def page(name: str) -> Response:
        body, ctype = files[name]
        return Response(body, media_type=ctype, headers=_HEADERS)

    @app.get("/", include_in_schema=False)
    async def chat_page():
        return page("index.html")

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard_page():
        return page("dashboard.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def asset(name: str):
        if name not in files:
            err = OpenAIError(f"no UI file {name[:80]!r}", 404, code="not_found")
            return JSONResponse(err.body(), status_code=404)
        return page(name)

    @app.get(EVENTS_PATH, include_in_schema=False)
    async def events(request: Request):
        try:
            interval = _interval(request, live.interval)
        except OpenAIError as e:
            return JSONResponse(e.body(), status_code=e.status)

        def stopped() -> bool:
            return server.draining or not llm.is_running
        return StreamingResponse(snapshot_events(live, interval, stopped),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
