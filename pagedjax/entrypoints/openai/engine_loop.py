"""The engine thread: one thread owns the LLMEngine and steps it while work exists.

HTTP handlers (on the asyncio loop) call :meth:`AsyncEngine.add` and
:meth:`AsyncEngine.abort`; both only append a command to a deque under a
``threading.Condition`` and notify it. The engine thread sleeps on that
condition when it has nothing to do (no polling), applies the commands between
steps, and hands every ``RequestOutput`` to the request's own
``asyncio.Queue`` through ``loop.call_soon_threadsafe``.

Failure isolation: a failing ``add_request`` fails that request only; an
exception raised while dispatching one request's output fails that request
only; an exception from ``engine.step()`` fails the requests that had been
scheduled (they are aborted, freeing their pages) while never-scheduled
waiting requests continue. The thread itself never dies from a request.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import traceback
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("pagedjax.server")


class EngineError(RuntimeError):
    """The engine failed while serving a request (HTTP 500)."""


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tag: Any  # handed back with every item (e.g. the prompt index)


class AsyncEngine:
    def __init__(self, engine, metrics=None):
        self.engine = engine
        self.metrics = metrics
        self._cv = threading.Condition()
        self._cmds: collections.deque = collections.deque()
        self._sinks: dict[str, _Sink] = {}  # engine-thread only
        self._stopping = False
        self.fault_next_step = False  # test hook: the next engine step raises
        self._thread = threading.Thread(target=self._run, name="pagedjax-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ loop side
    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def _submit(self, cmd: tuple) -> None:
        with self._cv:
            self._cmds.append(cmd)
            self._cv.notify()

    async def add(self, request_id: str, prompt: Any, params, queue: asyncio.Queue, tag: Any = None,
                  priority: int = 0) -> None:
        """Queue one engine request; raises ValueError (bad request) or EngineError."""
        if not self.alive:
            raise EngineError("the engine thread is not running")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._submit(("add", request_id, prompt, params, _Sink(loop, queue, tag), fut, priority))
        await fut  # raises what add_request raised

    def abort(self, request_ids) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        if ids:
            self._submit(("abort", ids))

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ engine thread
    @staticmethod
    def _deliver(sink: _Sink, item) -> None:
        try:
            sink.loop.call_soon_threadsafe(sink.queue.put_nowait, (sink.tag, item))
        except RuntimeError:  # the loop is closed (server shutting down)
            pass

    @staticmethod
    def _resolve(loop, fut, exc: BaseException | None) -> None:
        def done():
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)
        try:
            loop.call_soon_threadsafe(done)
        except RuntimeError:
            pass

    def _fail(self, request_id: str, exc: BaseException) -> None:
        sink = self._sinks.pop(request_id, None)
        try:
            self.engine.abort_request(request_id)
        except Exception:  # noqa: BLE001
            logger.exception("abort of %s failed", request_id)
        if sink is not None:
            self._deliver(sink, exc)

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, rid, prompt, params, sink, fut, priority = cmd
            try:
                self.engine.add_request(rid, prompt, params, priority=priority)
            except Exception as e:  # noqa: BLE001 - ValueError: bad input; else engine bug
                if not isinstance(e, ValueError):
                    logger.exception("add_request %s failed", rid)
                    e = EngineError(f"the engine could not add the request: {e}")
                self._resolve(sink.loop, fut, e)
                return
            self._sinks[rid] = sink
            self._resolve(sink.loop, fut, None)
        elif cmd[0] == "abort":
            for rid in cmd[1]:
                self._sinks.pop(rid, None)
                self.engine.abort_request(rid)

    def _scheduled_ids(self) -> list[str]:
        """Requests that have been scheduled at least once (a failed step touched them)."""
        return self.engine.scheduled_request_ids() or self.engine.request_ids()

    def _step(self) -> None:
        try:
            if self.fault_next_step:
                self.fault_next_step = False
                raise RuntimeError("injected engine fault (test hook)")
            outputs = self.engine.step()
        except Exception as e:  # noqa: BLE001
            logger.error("engine step failed:\n%s", traceback.format_exc())
            if self.metrics is not None:
                self.metrics.engine_errors.inc()
            err = EngineError(f"the engine failed while running this request: "
                              f"{type(e).__name__}: {e}")
            for rid in self._scheduled_ids():
                self._fail(rid, err)
            return
        if self.metrics is not None:
            self.metrics.steps.inc()
        for out in outputs:
            try:
                if out.finished:
                    sink = self._sinks.pop(out.request_id, None)
                    if self.metrics is not None:
                        self.metrics.observe_finished(out)
                else:
                    sink = self._sinks.get(out.request_id)
                if sink is not None:
                    self._deliver(sink, out)
            except Exception as e:  # noqa: BLE001
                logger.exception("dispatch of %s failed", out.request_id)
                self._fail(out.request_id, EngineError(f"output dispatch failed: {e}"))

    def _run(self) -> None:
        eng = self.engine
        while True:
            with self._cv:
                while not self._cmds and not self._stopping and not eng.has_unfinished_requests():
                    self._cv.wait()
                if self._stopping:
                    break
                cmds = list(self._cmds)
                self._cmds.clear()
            try:
                for cmd in cmds:
                    self._apply(cmd)
                if eng.has_unfinished_requests():
                    self._step()
                # Requests that the engine no longer knows (finished with an
                # output we already dispatched, or aborted) have no sink left.
                if self.metrics is not None:
                    self.metrics.update_engine(eng, len(self._sinks))
            except Exception:  # noqa: BLE001 - keep the thread alive whatever happens
                logger.error("engine loop error:\n%s", traceback.format_exc())
        # Shutting down: fail whatever is left.
        err = EngineError("the server is shutting down")
        for rid in list(self._sinks):
            self._fail(rid, err)
