"""Per-request output streams of :class:`pagedjax.AsyncLLM`.

The engine's outputs are cumulative, so a stream keeps only the latest one: a
slow consumer never makes outputs pile up (memory stays one output per
request), and it loses nothing, since the latest output contains everything
before it. ``DeltaTracker`` turns the cumulative outputs a consumer sees into
deltas whose text, token ids and logprobs concatenate exactly to the final
output (``RequestOutputKind.DELTA``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable, Optional

from pagedjax.outputs import CompletionOutput, RequestOutput
from pagedjax.sampling_params import RequestOutputKind


class RequestStream:
    """The outputs of one request, as an async iterator (``AsyncLLM.add_request``).

    ``put`` runs on the consumer's event loop (the engine thread schedules it
    with ``loop.call_soon_threadsafe``); ``__anext__`` waits for the next
    output in the request's ``output_kind``. ``close()`` aborts the request if
    it has not finished (``on_close`` is called with the request id).
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop,
                 kind: RequestOutputKind, on_close: Callable[[str], None]):
        self.request_id = request_id
        self.loop = loop
        self.kind = kind
        self.finished = False
        self._on_close = on_close
        self._tracker = DeltaTracker() if kind is RequestOutputKind.DELTA else None
        self._event = asyncio.Event()
        self._latest: Optional[RequestOutput] = None
        self._error: Optional[BaseException] = None
        self._ended = False

    # engine side (on the loop) -------------------------------------------------
    def put(self, item) -> None:
        if isinstance(item, BaseException):
            self._error = item
        elif item is None:
            self._ended = True  # aborted before any output: the stream just ends
        else:
            self._latest = item
        self._event.set()

    # consumer side ---------------------------------------------------------------
    async def _next_cumulative(self) -> Optional[RequestOutput]:
        while True:
            if self._latest is not None:
                out, self._latest = self._latest, None
                return out
            if self._error is not None:
                self.finished = True
                raise self._error
            if self._ended:
                return None
            self._event.clear()
            await self._event.wait()

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        while not self.finished:
            out = await self._next_cumulative()
            if out is None:
                self.finished = True
                break
            self.finished = out.finished
            if self.kind is RequestOutputKind.FINAL_ONLY and not out.finished:
                continue
            if self._tracker is not None:
                out = self._tracker.delta(out)
                if out is None:
                    continue
            return out
        raise StopAsyncIteration

    def close(self) -> None:
        """Abort the request unless it has finished (idempotent)."""
        if not self.finished:
            self.finished = True
            self._on_close(self.request_id)


def _delta_completion(cur: CompletionOutput, sent: tuple[int, int]) -> CompletionOutput:
    n_text, n_tok = sent
    return dataclasses.replace(
        cur, text=cur.text[n_text:], token_ids=list(cur.token_ids[n_tok:]),
        logprobs=list(cur.logprobs[n_tok:]) if cur.logprobs is not None else None)


class DeltaTracker:
    """What one consumer has already received of a request, per completion index."""

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, int]] = {}
        self._done: set[int] = set()
        self._first = True

    def delta(self, out: RequestOutput) -> Optional[RequestOutput]:
        """The part of cumulative ``out`` not sent before; None when nothing is new."""
        comps = []
        for c in out.outputs:
            if c.index in self._done:
                continue
            sent = self._sent.get(c.index, (0, 0))
            d = _delta_completion(c, sent)
            if not d.text and not d.token_ids and c.finish_reason is None:
                continue
            self._sent[c.index] = (len(c.text), len(c.token_ids))
            if c.finish_reason is not None:
                self._done.add(c.index)
            comps.append(d)
        if not comps and not out.finished:
            return None
        first, self._first = self._first, False
        return dataclasses.replace(out, outputs=comps,
                                   prompt_logprobs=out.prompt_logprobs if first else None)
