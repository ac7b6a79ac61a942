"""AsyncLLM: stream outputs from an engine owned by one background thread.

    llm = AsyncLLM(max_model_len=512)           # or AsyncLLM.from_engine(engine)
    params = SamplingParams(max_tokens=32, output_kind=RequestOutputKind.DELTA)
    async for out in llm.generate("Hello, my name is", params, "req-1"):
        print(out.outputs[0].text, end="", flush=True)

Works from ``asyncio.run`` and inside a Jupyter cell (whose event loop is
already running): nothing here blocks the caller's loop.

Design. One thread owns the :class:`~pagedjax.engine.llm_engine.LLMEngine` (it is not
thread-safe). Callers only append a command (add, abort) to a deque under a
``threading.Condition`` and notify it; the thread sleeps on the condition
when there is no work (no polling), applies the commands between steps and
hands each request's output to its :class:`~pagedjax.engine.output_stream.RequestStream`
with ``loop.call_soon_threadsafe``. Text prompts are tokenized in a small
worker pool first, and detokenization happens inside ``engine.step()`` on
the engine thread, so CPU work per request stays off the caller's loop.

Failures: a bad request raises ``ValueError`` from ``generate``; an exception
inside a step fails the requests that had been scheduled (``EngineStepError``,
their pages freed) while the thread keeps serving; if the thread itself dies,
every stream gets ``EngineDeadError``, ``is_running`` turns False and the
callbacks of ``add_dead_callback`` run.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import traceback
import uuid
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from pagedjax.engine import input_checks as checks
from pagedjax.engine.output_stream import RequestStream
from pagedjax.outputs import RequestOutput
from pagedjax.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger("pagedjax.engine.async_llm")


class EngineStepError(RuntimeError):
    """The engine step that was running this request raised; the request was aborted."""


class EngineDeadError(RuntimeError):
    """The engine thread is not running (it died or was shut down)."""


class _ThreadKill(BaseException):
    """Test hook only: escapes every handler and ends the engine thread."""


class AsyncLLM:
    """An :class:`LLMEngine` driven by a background thread, with async streaming.

    ``AsyncLLM(model=None, **engine_kwargs)`` takes :class:`EngineArgs` fields;
    ``AsyncLLM.from_engine(engine)`` wraps an engine that nothing else steps.
    ``stat_logger`` (optional) gets ``on_step(engine, num_requests)``,
    ``on_finished(output, seqs)`` and ``on_error()`` calls from the engine thread.
    """

    def __init__(self, model: Optional[str] = None, tokenizer: Optional[str] = None, *,
                 stat_logger: Any = None, **engine_kwargs: Any):
        from pagedjax.config import EngineArgs
        from pagedjax.engine.llm_engine import LLMEngine

        checks.unknown_kwargs("AsyncLLM", engine_kwargs, EngineArgs.__dataclass_fields__)
        engine = LLMEngine(EngineArgs(model=model, tokenizer=tokenizer, **engine_kwargs))
        self._start(engine, stat_logger)

    @classmethod
    def from_engine(cls, engine, stat_logger: Any = None) -> "AsyncLLM":
        self = cls.__new__(cls)
        self._start(engine, stat_logger)
        return self

    def _start(self, engine, stat_logger) -> None:
        self.engine = engine
        self.stat_logger = stat_logger
        self._cv = threading.Condition()
        self._cmds: collections.deque = collections.deque()
        self._streams: dict[str, list] = {}  # engine thread only: id -> [stream, last output]
        self._stopping = False
        self._dead: Optional[BaseException] = None
        self._fault: Optional[str] = None
        self._dead_callbacks: list[Callable[[BaseException], None]] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pagedjax-worker")
        self._thread = threading.Thread(target=self._run, name="pagedjax-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ state
    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._dead is None and not self._stopping

    @property
    def errored(self) -> bool:
        """True when the engine thread died of an error (not a shutdown)."""
        return self._dead is not None and not isinstance(self._dead, _Shutdown)

    @property
    def num_requests(self) -> int:
        """Requests with a live stream (added and not yet finished or aborted)."""
        return len(self._streams)

    def add_dead_callback(self, fn: Callable[[BaseException], None]) -> None:
        """``fn(error)`` runs on the engine thread if that thread dies of an error."""
        self._dead_callbacks.append(fn)

    def inject_step_fault(self, kind: str = "step") -> None:
        """Test hook: the next step with work raises (``"step"``) or kills the thread (``"thread"``)."""
        if kind not in ("step", "thread"):
            raise ValueError(f"fault kind must be 'step' or 'thread', got {kind!r}")
        with self._cv:
            self._fault = kind
            self._cv.notify()

    async def run_in_worker(self, fn: Callable, *args: Any) -> Any:
        """Run CPU-bound ``fn(*args)`` (tokenizing, templating) in the worker pool."""
        try:
            fut = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except RuntimeError as e:  # the pool is shut down
            raise EngineDeadError(self._dead_message()) from e
        return await fut

    async def check_lora(self, lora_request) -> None:
        """Read and check an adapter off the engine thread (ValueError if it cannot
        be served); it is loaded onto the device when a request uses it."""
        await self.run_in_worker(self.engine.validate_lora, lora_request)

    async def tokenize(self, prompt: Any) -> tuple[Optional[str], list[int]]:
        """``engine.tokenize`` in the worker pool: (text or None, token ids)."""
        return await self.run_in_worker(self.engine.tokenize, prompt)

    # ------------------------------------------------------------------ caller side
    def _submit(self, cmd: tuple) -> None:
        with self._cv:
            if self._dead is not None or self._stopping:
                raise EngineDeadError(self._dead_message())
            self._cmds.append(cmd)
            self._cv.notify()

    def _dead_message(self) -> str:
        if self._stopping or isinstance(self._dead, _Shutdown):
            return "the engine is shutting down"
        return f"the engine thread died: {self._dead}"

    async def add_request(self, request_id: str, prompt: Any,
                          params: Optional[SamplingParams] = None, *,
                          priority: int = 0, lora_request=None) -> RequestStream:
        """Queue one request; its outputs come from the returned stream.

        Raises ``ValueError`` for a bad request. Iterate the stream with
        ``async for``; ``stream.close()`` aborts the request if unfinished.
        """
        params = checks.sampling_params(params)
        checks.request_id(request_id)
        checks.check_prompt(prompt)
        priority = checks.priority(priority)
        params.verify_vocab(self.engine.info.vocab_size)
        text, ids = await self.tokenize(prompt)  # ids range-checked; in the worker pool
        prompt = {**(prompt if isinstance(prompt, dict) else {}), "prompt": text,
                  "prompt_token_ids": ids}
        if params.structured_outputs is not None:  # compiled off the engine thread (cached)
            await self.run_in_worker(self.engine.compile_grammar, params)
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, loop, params.output_kind, self._abort_nowait)
        added = loop.create_future()
        self._submit(("add", request_id, prompt, params, stream, added, priority, lora_request))
        try:
            await added  # raises ValueError for a bad request
        except ValueError:
            raise
        except BaseException:  # cancelled while queued: the add may still happen
            stream.close()
            raise
        return stream

    async def generate(self, prompt: Any, sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None, *,
                       priority: int = 0, lora_request=None) -> AsyncIterator[RequestOutput]:
        """Yield this request's outputs as the engine produces them.

        ``sampling_params.output_kind`` picks cumulative outputs (default),
        deltas, or the final output only. Leaving the ``async for`` early, or
        cancelling the task, aborts the request and frees its pages.
        """
        rid = request_id if request_id is not None else f"req-{uuid.uuid4().hex}"
        if not isinstance(rid, str) or not rid:
            raise checks.ArgumentTypeError(f"request_id must be a non-empty string, got "
                                           f"{checks.short(rid)}.")
        stream = await self.add_request(rid, prompt, sampling_params, priority=priority,
                                        lora_request=lora_request)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def _abort_nowait(self, ids: str | Sequence[str]) -> None:
        ids = [ids] if isinstance(ids, str) else list(ids)
        try:
            self._submit(("abort", ids, None))
        except EngineDeadError:
            pass  # the thread is gone; it failed every request when it stopped

    async def abort(self, request_id: str | Sequence[str]) -> None:
        """Abort requests (their pages are freed before this returns)."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        fut = asyncio.get_running_loop().create_future()
        self._submit(("abort", ids, fut))
        await fut

    def shutdown(self, timeout: float = 30.0) -> None:
        """Fail every live request (pages freed), stop the engine thread and the pool."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self._pool.shutdown(wait=False)  # queued work still runs; new work is refused

    # ------------------------------------------------------------------ engine thread
    @staticmethod
    def _call(loop, fn, *args) -> None:
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # that loop is closed: nobody is listening
            pass

    @classmethod
    def _resolve(cls, fut, exc: Optional[BaseException]) -> None:
        if fut is None:
            return

        def done():
            if not fut.done():
                fut.set_result(None) if exc is None else fut.set_exception(exc)
        cls._call(fut.get_loop(), done)

    def _end(self, rid: str, item) -> None:
        """Remove a request's stream (aborting it in the engine) and deliver ``item``."""
        entry = self._streams.pop(rid, None)
        try:
            self.engine.abort_request(rid)
        except Exception:  # noqa: BLE001
            logger.exception("abort of %s failed", rid)
        if entry is not None:
            self._call(entry[0].loop, entry[0].put, item)

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, rid, prompt, params, stream, fut, priority, lora = cmd
            try:
                self.engine.add_request(rid, prompt, params, priority=priority, lora_request=lora)
            except Exception as e:  # noqa: BLE001 - ValueError: bad input; else an engine bug
                if not isinstance(e, ValueError):
                    logger.exception("add_request %s failed", rid)
                    e = EngineStepError(f"the engine could not add the request: {e}")
                self._resolve(fut, e)
                return
            # [stream, latest output, per completion (finish reason, tokens) of a delta stream]
            self._streams[rid] = [stream, None, {}]
            self._resolve(fut, None)
        else:
            _, ids, fut = cmd
            for rid in ids:
                entry = self._streams.get(rid)
                last = entry[1] if entry is not None else None
                self._end(rid, _aborted(last, entry[0].kind) if last is not None else None)
            self._resolve(fut, None)

    def _step(self) -> None:
        try:
            fault, self._fault = self._fault, None
            if fault == "thread":
                raise _ThreadKill("injected engine thread death (test hook)")
            if fault == "step":
                raise RuntimeError("injected engine fault (test hook)")
            outputs = self.engine.step()
        except Exception as e:  # noqa: BLE001
            logger.error("engine step failed:\n%s", traceback.format_exc())
            if self.stat_logger is not None:
                self.stat_logger.on_error()
            err = EngineStepError(f"the engine failed while running this request: "
                                  f"{type(e).__name__}: {e}")
            for rid in self.engine.step_request_ids() or self.engine.request_ids():
                self._end(rid, err)
            return
        for out in outputs:
            entry = self._streams.get(out.request_id)
            seqs = None
            if entry is not None and entry[0].kind is RequestOutputKind.DELTA:
                totals = entry[2]  # deltas: the metrics want each completion's totals
                for c in out.outputs:
                    totals[c.index] = (c.finish_reason,
                                       totals.get(c.index, (None, 0))[1] + len(c.token_ids))
                seqs = list(totals.values())
            if out.finished:
                self._streams.pop(out.request_id, None)
                if self.stat_logger is not None:
                    self.stat_logger.on_finished(out, seqs)
            if entry is not None:
                entry[1] = out
                self._call(entry[0].loop, entry[0].put, out)

    def _loop_once(self) -> bool:
        eng = self.engine
        with self._cv:
            while not self._cmds and not self._stopping and not eng.has_unfinished_requests():
                self._cv.wait()
            if self._stopping:
                return False
            cmds = list(self._cmds)
            self._cmds.clear()
        for cmd in cmds:
            self._apply(cmd)
        if eng.has_unfinished_requests():
            self._step()
        if self.stat_logger is not None:
            self.stat_logger.on_step(eng, len(self._streams))
        return True

    def _run(self) -> None:
        err: BaseException = _Shutdown("the engine is shutting down")
        try:
            while self._loop_once():
                pass
        except BaseException as e:  # noqa: BLE001 - the thread dies: say so everywhere
            logger.critical("engine thread died:\n%s", traceback.format_exc())
            err = e
        with self._cv:
            self._dead = err
            cmds = list(self._cmds)
            self._cmds.clear()
        if not isinstance(err, _Shutdown):
            for fn in self._dead_callbacks:
                try:
                    fn(err)
                except Exception:  # noqa: BLE001
                    logger.exception("dead callback failed")
        exc = EngineDeadError(self._dead_message())
        for cmd in cmds:
            self._resolve(cmd[5] if cmd[0] == "add" else cmd[2], exc if cmd[0] == "add" else None)
        for rid in list(self._streams):
            self._end(rid, exc)


class _Shutdown(Exception):
    """Why the engine thread stopped when it was asked to."""


def _aborted(last: RequestOutput, kind: RequestOutputKind) -> RequestOutput:
    """The final output of a request aborted by ``abort()``: finish_reason 'abort'.
    A delta stream gets empty deltas that carry the finish (``last`` was sent)."""
    import dataclasses

    if kind is RequestOutputKind.DELTA:
        outs = [dataclasses.replace(o, text="", token_ids=[], finish_reason="abort",
                                    logprobs=[] if o.logprobs is not None else None)
                for o in last.outputs if o.finish_reason is None]
        return dataclasses.replace(last, outputs=outs, finished=True, prompt_logprobs=None)
    outs = [o if o.finish_reason is not None else dataclasses.replace(o, finish_reason="abort")
            for o in last.outputs]
    return dataclasses.replace(last, outputs=outs, finished=True)
