"""AsyncLLM on the real default model: streaming kinds, concurrency, aborts, errors, faults.

One engine serves every test (module fixture); the greedy reference comes from
``LLM.generate`` with the same engine arguments in the same process.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pagedjax import AsyncLLM, LLM, RequestOutputKind, SamplingParams

ARGS = dict(max_model_len=256, max_num_seqs=4, num_pages=64)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    llm = LLM(**ARGS)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                logprobs=1), use_tqdm=False)
    return {p: o.outputs[0] for p, o in zip(PROMPTS, outs)}


@pytest.fixture(scope="module")
def allm(smollm2_gguf):
    llm = AsyncLLM(**ARGS)
    yield llm
    llm.shutdown()
    assert not llm.is_running


def _params(kind: RequestOutputKind, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", MAX_TOKENS)
    return SamplingParams(temperature=0.0, output_kind=kind, **kw)


async def _collect(llm, prompt, params, rid):
    return [o async for o in llm.generate(prompt, params, rid)]


async def _wait_pages_free(llm, timeout: float = 30.0):
    deadline = time.time() + timeout
    while llm.engine.pool_stats().used or llm.num_requests:
        assert time.time() < deadline, llm.engine.pool_stats()
        await asyncio.sleep(0.02)


def test_delta_concatenates_to_llm_generate(allm, reference):
    outs = asyncio.run(_collect(allm, PROMPTS[0], _params(RequestOutputKind.DELTA, logprobs=1),
                                "delta-0"))
    ref = reference[PROMPTS[0]]
    assert len(outs) > 2  # streamed, not one lump
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert "".join(o.outputs[0].text for o in outs if o.outputs) == ref.text
    ids = [t for o in outs for c in o.outputs for t in c.token_ids]
    assert ids == ref.token_ids
    lps = [d for o in outs for c in o.outputs for d in c.logprobs]
    assert [sorted(d) for d in lps] == [sorted(d) for d in ref.logprobs]
    assert [d[t].logprob for d, t in zip(lps, ids)] == pytest.approx(
        [d[t].logprob for d, t in zip(ref.logprobs, ref.token_ids)], abs=1e-4)
    assert outs[-1].outputs[0].finish_reason == ref.finish_reason


def test_cumulative_and_final_only(allm, reference):
    cum = asyncio.run(_collect(allm, PROMPTS[1], _params(RequestOutputKind.CUMULATIVE), "cum"))
    texts = [o.outputs[0].text for o in cum]
    assert len(cum) > 2 and all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == reference[PROMPTS[1]].text and cum[-1].finished
    fin = asyncio.run(_collect(allm, PROMPTS[1], _params(RequestOutputKind.FINAL_ONLY), "fin"))
    assert len(fin) == 1 and fin[0].finished
    assert fin[0].outputs[0].token_ids == reference[PROMPTS[1]].token_ids


def test_concurrent_generators(allm, reference):
    async def main():
        runs = [_collect(allm, p, _params(RequestOutputKind.DELTA), f"conc-{i}-{k}")
                for k in range(2) for i, p in enumerate(PROMPTS)]
        return await asyncio.gather(*runs)

    results = asyncio.run(main())
    for k in range(2):
        for i, p in enumerate(PROMPTS):
            outs = results[k * len(PROMPTS) + i]
            assert "".join(c.text for o in outs for c in o.outputs) == reference[p].text
            assert outs[-1].finished
    asyncio.run(_wait_pages_free(allm))


def test_break_cancel_and_abort_free_every_page(allm):
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)

    async def main():
        # 1. breaking out of the async for aborts the request
        n = 0
        async for out in allm.generate("Tell me a story", long, "brk"):
            n += 1
            if n == 3:
                assert allm.engine.pool_stats().used > 0
                break
        await _wait_pages_free(allm)
        # 2. cancelling the consuming task aborts it
        started = asyncio.Event()

        async def consume():
            async for _ in allm.generate("Count slowly", long, "cnl"):
                started.set()
        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_pages_free(allm)
        # 3. await abort(): pages are free when it returns; the stream ends with 'abort'
        gen = allm.generate("Write a poem", long, "abt")
        outs = [await gen.__anext__(), await gen.__anext__()]
        await allm.abort("abt")
        assert allm.engine.pool_stats().used == 0
        outs += [o async for o in gen]
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"

    asyncio.run(main())
    assert allm.engine.pool_stats().used == 0 and not allm.engine.has_unfinished_requests()


def test_bad_request_raises_value_error(allm):
    async def main():
        with pytest.raises(ValueError, match="max_model_len"):
            await _collect(allm, [1] * 300, SamplingParams(), "too-long")
        with pytest.raises(ValueError, match="prompt"):
            await _collect(allm, [10**9], SamplingParams(), "bad-id")
        with pytest.raises(ValueError, match="sampling_params"):
            await _collect(allm, "hi", {"max_tokens": 2}, "bad-params")
        # a duplicate id is refused while the first request is live
        gen = allm.generate("x", SamplingParams(max_tokens=50, ignore_eos=True), "dup")
        await gen.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            await _collect(allm, "y", SamplingParams(max_tokens=2), "dup")
        await gen.aclose()
        await _wait_pages_free(allm)

    asyncio.run(main())
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="delta")
    # an IntEnum: parameters survive JSON (multi-host replay sends them as JSON)
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA


def test_step_fault_fails_only_scheduled_requests(allm, reference):
    async def main():
        allm.inject_step_fault("step")
        from pagedjax.engine.async_llm import EngineStepError

        with pytest.raises(EngineStepError, match="injected"):
            await _collect(allm, PROMPTS[0], _params(RequestOutputKind.DELTA), "fault")
        await _wait_pages_free(allm)
        outs = await _collect(allm, PROMPTS[0], _params(RequestOutputKind.FINAL_ONLY), "after")
        assert outs[0].outputs[0].text == reference[PROMPTS[0]].text

    asyncio.run(main())
    assert allm.is_running


def test_engine_thread_death(smollm2_gguf):
    from pagedjax.engine.async_llm import EngineDeadError

    llm = AsyncLLM.from_engine(_small_engine())
    died = []
    llm.add_dead_callback(died.append)

    async def main():
        gen = llm.generate("Hello", SamplingParams(max_tokens=100, ignore_eos=True), "a")
        await gen.__anext__()
        llm.inject_step_fault("thread")
        with pytest.raises(EngineDeadError):
            async for _ in gen:
                pass
        with pytest.raises(EngineDeadError):
            await _collect(llm, "Hi", SamplingParams(max_tokens=2), "b")

    asyncio.run(main())
    assert died and llm.errored and not llm.is_running
    assert llm.engine.pool_stats().used == 0
    llm.shutdown()


def _small_engine():
    from pagedjax import EngineArgs, LLMEngine

    return LLMEngine(EngineArgs(max_model_len=128, max_num_seqs=2, num_pages=16))


def test_slow_consumer_gets_merged_deltas():
    """Deltas put while the consumer is busy merge into one pending output: nothing is
    lost and nothing queues; a cumulative stream keeps only the newest output."""
    from pagedjax.engine.output_stream import RequestStream
    from pagedjax.outputs import CompletionOutput, RequestOutput

    def out(text, ids, finished=False, plp=None):
        return RequestOutput("r", "p", [1], plp, [CompletionOutput(
            0, text, ids, None, None, "stop" if finished else None)], finished)

    async def main(kind, items):
        s = RequestStream("r", asyncio.get_running_loop(), kind, lambda rid: None)
        for it in items:
            s.put(it)
        return [o async for o in s]

    got = asyncio.run(main(RequestOutputKind.DELTA, [out("Hel", [5], plp=[None]), out("lo", [6]),
                                                      out("!", [7], finished=True)]))
    assert len(got) == 1 and got[0].finished and got[0].prompt_logprobs == [None]
    c = got[0].outputs[0]
    assert (c.text, c.token_ids, c.finish_reason) == ("Hello!", [5, 6, 7], "stop")
    got = asyncio.run(main(RequestOutputKind.CUMULATIVE, [out("Hel", [5]),
                                                          out("Hello", [5, 6], finished=True)]))
    assert [o.outputs[0].text for o in got] == ["Hello"]
