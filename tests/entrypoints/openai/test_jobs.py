"""A job whose engine request ends without a final output (the engine aborted it
before its first token) answers one error, 503 service_unavailable, for every
endpoint that collects final outputs: completions, chat, embeddings, score."""

from __future__ import annotations

import asyncio

import pytest

from pagedjax.engine.output_stream import RequestStream
from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.jobs import Job, pooled_outputs
from pagedjax.outputs import RequestOutput
from pagedjax.sampling_params import RequestOutputKind, SamplingParams


class _Engine:
    """AsyncLLM's add_request contract: each request's stream gets ``script[i]``
    (an output, or None for "aborted before any output") on the loop."""

    def __init__(self, script):
        self.script = list(script)
        self.closed = []

    async def add_request(self, rid, prompt, params, lora_request=None):
        loop = asyncio.get_running_loop()
        stream = RequestStream(rid, loop, RequestOutputKind.FINAL_ONLY, self.closed.append)
        loop.call_soon(stream.put, self.script.pop(0))
        return stream


def _final(rid, hidden=None):
    return RequestOutput(request_id=rid, prompt="p", prompt_token_ids=[1, 2], prompt_logprobs=None,
                         outputs=[],
                         finished=True, prompt_hidden_states=hidden)


def _run(coro):
    return asyncio.run(coro)


def test_stream_ended_without_output_is_a_503():
    async def go(script, n):
        job = Job(_Engine(script), "cmpl-x")
        await job.start([{"prompt_token_ids": [1]}] * n, SamplingParams(), watch_disconnect=False)
        return await job.final_outputs()

    finals = _run(go([_final("cmpl-x.0"), _final("cmpl-x.1")], 2))
    assert sorted(finals) == [0, 1] and finals[1].request_id == "cmpl-x.1"
    with pytest.raises(OpenAIError) as e:
        _run(go([_final("cmpl-x.0"), None], 2))
    body = e.value.body()["error"]
    assert e.value.status == 503 and body["code"] == "service_unavailable"
    assert "send it again" in body["message"]


def test_pooling_without_hidden_states_is_the_same_503():
    params = SamplingParams(max_tokens=0, prompt_hidden_states="last")
    engine = _Engine([_final("e.0", hidden=[[0.5]]), _final("e.1", hidden=[[0.25]])])
    outs = _run(pooled_outputs(engine, "e", None, [{"prompt_token_ids": [1]}] * 2, params))
    assert [o.prompt_hidden_states for o in outs] == [[[0.5]], [[0.25]]]
    for script in ([_final("e.0", hidden=[[0.5]]), None], [_final("e.0"), _final("e.1")]):
        with pytest.raises(OpenAIError) as e:
            _run(pooled_outputs(_Engine(script), "e", None, [{"prompt_token_ids": [1]}] * 2,
                                params))
        assert e.value.status == 503
