"""One HTTP request's engine requests on :class:`pagedjax.AsyncLLM`.

A completions request may carry several prompts; each becomes one engine
request (``<id>.<i>``) with its own stream, merged here into ``(prompt index,
RequestOutput)`` pairs. Engine failures become OpenAI errors: a failed step is
a 500, an engine that is gone (died or shutting down) a 503, and so is a
request the engine aborted before its first output (``aborted_error``: nothing
was wrong with the request, sending it again may succeed). A non-streaming
client that disconnects has its requests aborted (``ClientDisconnected``);
streaming responses are closed by Starlette on disconnect, which closes the job.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Optional

from pagedjax.engine.async_llm import AsyncLLM, EngineDeadError, EngineStepError
from pagedjax.entrypoints.openai.errors import OpenAIError, param_of
from pagedjax.engine.output_stream import RequestStream
from pagedjax.sampling_params import SamplingParams


class ClientDisconnected(Exception):
    """The HTTP client went away; its engine requests have been aborted."""


def engine_error(e: BaseException) -> OpenAIError:
    if isinstance(e, EngineDeadError):
        return OpenAIError(str(e), 503, type="server_error", code="service_unavailable")
    return OpenAIError(str(e), 500, type="server_error")


def aborted_error() -> OpenAIError:
    """A request whose stream ended without a final output: the engine aborted it."""
    return OpenAIError("the engine aborted the request before it finished (it was cancelled "
                       "or the server is stopping); send it again.", 503,
                       type="server_error", code="service_unavailable")


class Job:
    def __init__(self, llm: AsyncLLM, base_id: str, raw_request=None):
        self.llm = llm
        self.base_id = base_id
        self.streams: list[RequestStream] = []
        self.disconnected = False
        self._raw = raw_request
        self._watch: Optional[asyncio.Task] = None

    async def start(self, prompts: list[dict], params: SamplingParams,
                    watch_disconnect: bool, lora_request=None) -> None:
        """Add every prompt's request; a bad one aborts the others (OpenAIError)."""
        try:
            for i, p in enumerate(prompts):
                self.streams.append(await self.llm.add_request(
                    f"{self.base_id}.{i}", p, params, lora_request=lora_request))
        except ValueError as e:
            self.close()
            raise OpenAIError(str(e), 400, param=param_of(str(e)) or "prompt") from e
        except (EngineDeadError, EngineStepError) as e:
            self.close()
            raise engine_error(e) from e
        except BaseException:
            self.close()
            raise
        if watch_disconnect and self._raw is not None and hasattr(self._raw, "receive"):
            self._watch = asyncio.create_task(self._watch_disconnect())

    async def _watch_disconnect(self) -> None:
        try:
            while (await self._raw.receive()).get("type") != "http.disconnect":
                pass
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the receive channel is gone: a disconnect
            pass
        self.disconnected = True
        self.close()

    async def outputs(self) -> AsyncIterator[tuple[int, object]]:
        """(prompt index, output) as they come; raises OpenAIError or ClientDisconnected."""
        try:
            if len(self.streams) == 1:
                async for out in self.streams[0]:
                    yield 0, out
            else:
                async for item in _merge(self.streams):
                    yield item
        except (EngineDeadError, EngineStepError) as e:
            self.close()
            raise engine_error(e) from e
        if self.disconnected:
            raise ClientDisconnected()

    async def final_outputs(self) -> dict[int, object]:
        """Every prompt's final output by prompt index, then close the job; a
        prompt that ended without one raises :func:`aborted_error`."""
        try:
            finals = {i: out async for i, out in self.outputs()}
        finally:
            self.close()
        if len(finals) < len(self.streams):
            raise aborted_error()
        return finals

    def close(self) -> None:
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        self._watch = None
        for s in self.streams:
            s.close()


async def _merge(streams: list[RequestStream]):
    """Interleave several streams, one pending read per stream (no unbounded queue)."""
    pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                i = pending.pop(t)
                try:
                    out = t.result()
                except StopAsyncIteration:
                    continue
                yield i, out
                pending[asyncio.ensure_future(streams[i].__anext__())] = i
    finally:
        for t in pending:
            t.cancel()


async def pooled_outputs(llm: AsyncLLM, base_id: str, raw_request, prompts: list[dict],
                         params: SamplingParams, lora_request=None) -> list:
    """Run prefill-only (pooling) ``prompts`` as one job and return their final
    outputs in prompt order, each with ``prompt_hidden_states``."""
    job = Job(llm, base_id, raw_request)
    await job.start(prompts, params, watch_disconnect=True, lora_request=lora_request)
    finals = await job.final_outputs()
    if any(o.prompt_hidden_states is None for o in finals.values()):
        raise aborted_error()  # aborted after a partial prefill
    return [finals[i] for i in range(len(prompts))]
