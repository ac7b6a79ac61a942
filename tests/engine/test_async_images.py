"""AsyncLLM with images (a tiny random Qwen2.5-VL): two concurrent streams with
different images give transformers' greedy tokens, and aborting one while its image
is being prefilled frees its pages and its hold on the encoder cache entry."""

from __future__ import annotations

import asyncio
import time

import pytest

from pagedjax import AsyncLLM, RequestOutputKind, SamplingParams
from pagedjax.engine.mm_processor import content_hash
from tests.utils import qwen_vl as Q
from tests.utils import vlm

torch = pytest.importorskip("torch")

ONE = [1, 5, Q.VISION_START, Q.IMAGE_TOKEN, Q.VISION_END, 7]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen_vl_async"))
    return folder, Q.save_tiny_qwen_vl(folder)


@pytest.fixture(scope="module")
def allm(model):
    llm = AsyncLLM(model[0], num_pages=128, page_size=4, max_model_len=256,
                   max_num_batched_tokens=16, max_num_seqs=4)
    yield llm
    llm.shutdown()


def _prompt(img):
    return {"prompt_token_ids": ONE, "multi_modal_data": {"image": img}}


def _hf_tokens(hf_model, img, k: int):
    inputs = Q.hf_inputs([img])
    return Q.hf_greedy(hf_model, Q.prompt_ids(inputs["image_grid_thw"], (5,))[:-1],
                       inputs, k)


async def _stream(llm, img, rid, k):
    params = SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    return [o async for o in llm.generate(_prompt(img), params, rid)]


def test_two_concurrent_streams_with_different_images(model, allm):
    _, hf_model = model
    a, b = vlm.random_image(70, (40, 32)), vlm.random_image(71, (23, 19))

    async def both():
        return await asyncio.gather(_stream(allm, a, "img-a", 6), _stream(allm, b, "img-b", 6))

    outs_a, outs_b = asyncio.run(both())
    for outs, img in ((outs_a, a), (outs_b, b)):
        assert len(outs) > 2 and outs[-1].finished  # streamed, not one lump
        tokens = [t for o in outs for c in o.outputs for t in c.token_ids]
        assert tokens == _hf_tokens(hf_model, img, 6)
        assert outs[0].prompt_token_ids[:3] == ONE[:3]
        assert len(outs[0].prompt_token_ids) == len(ONE) - 1 + Q.tokens_of(
            Q.hf_inputs([img])["image_grid_thw"][0])
    assert allm.engine.pool_stats().used == 0


def test_abort_during_image_prefill_frees_pages_and_encoder_entry(model, allm):
    _, hf_model = model
    big, small = vlm.random_image(72, (64, 48)), vlm.random_image(73, (23, 19))
    big_hash = content_hash(big.convert("RGB"))
    cache = allm.engine.encoder_cache

    async def run():
        params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        doomed = await allm.add_request("doomed", _prompt(big), params)
        other = asyncio.ensure_future(_stream(allm, small, "other", 5))
        deadline = time.time() + 60
        while "doomed" not in cache.held:  # its image (48 rows) is being prefilled
            assert time.time() < deadline
            await asyncio.sleep(0.001)
        await allm.abort("doomed")  # pages freed before this returns
        held_after = ("doomed" in cache.held, big_hash in cache.holders)
        last = [o async for o in doomed]
        return held_after, last, await other

    (still_held, hash_held), last, other = asyncio.run(run())
    assert not still_held and not hash_held
    assert big_hash in cache.free_lru  # kept as a reusable, evictable entry
    # The stream ends (no output yet: nothing to report but the end) and the request is gone.
    assert not last or last[-1].outputs[0].finish_reason == "abort"
    assert allm.engine.core.is_finished("doomed")
    tokens = [t for o in other for c in o.outputs for t in c.token_ids]
    assert tokens == _hf_tokens(hf_model, small, 5)
    deadline = time.time() + 30
    while allm.engine.pool_stats().used or allm.num_requests:
        assert time.time() < deadline, allm.engine.pool_stats()
        time.sleep(0.02)
    assert not cache.held
