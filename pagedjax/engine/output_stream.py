"""Per-request output streams of :class:`pagedjax.AsyncLLM`.

A stream keeps one pending output, so a slow consumer never makes outputs
pile up and loses nothing: a cumulative output replaces the pending one (it
holds everything before it), a delta output (``RequestOutputKind.DELTA``,
built by the output processor) is merged into it (``RequestOutput.add``), so
the deltas a consumer sees still concatenate exactly to the final output.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

from pagedjax.outputs import RequestOutput
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
        elif self._latest is not None and self.kind is RequestOutputKind.DELTA:
            self._latest.add(item)  # not read yet: the deltas merge
        else:
            self._latest = item
        self._event.set()

    # consumer side ---------------------------------------------------------------
    async def _next_output(self) -> Optional[RequestOutput]:
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
            out = await self._next_output()
            if out is None:
                self.finished = True
                break
            self.finished = out.finished
            if self.kind is RequestOutputKind.FINAL_ONLY and not out.finished:
                continue
            return out
        raise StopAsyncIteration

    def close(self) -> None:
        """Abort the request unless it has finished (idempotent)."""
        if not self.finished:
            self.finished = True
            self._on_close(self.request_id)
