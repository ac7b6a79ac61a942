"""Warm-up of a vision-language runner (worker/mm_programs.py): the vision encoder at
every patch bucket the image processor can produce and the gather of the step's image
rows at every (token bucket, encoder output size) are compiled with the step programs,
so that no step compiles anything afterwards, whatever the images (different sizes,
chunks cut inside them, text-only rows beside them); the background compile pool
covers them too. A tiny random Qwen2.5-VL (three patch buckets) and LLaVA (one)."""

from __future__ import annotations

import pytest

from pagedjax import LLM, SamplingParams
from pagedjax.worker import warmup
from pagedjax.worker.plan import CompileCounter
from tests.utils import qwen_vl as Q
from tests.utils import vlm

pytest.importorskip("torch")

KW = dict(num_pages=96, page_size=4, max_model_len=192, max_num_batched_tokens=16,
          max_num_seqs=4)
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
# Patch counts 24, 80 and 192: buckets 64, 128 and 256.
QWEN_SIZES = [(23, 19), (40, 32), (64, 48)]


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen_vl_warm"))
    Q.save_tiny_qwen_vl(path)
    return path


def _qwen_workload(seed: int):
    img = [vlm.random_image(seed + i, size) for i, size in enumerate(QWEN_SIZES)]
    one = [1, 5, Q.VISION_START, Q.IMAGE_TOKEN, Q.VISION_END, 7]
    two = one + [Q.VISION_START, Q.IMAGE_TOKEN, Q.VISION_END, 8]
    return [{"prompt_token_ids": one, "multi_modal_data": {"image": img[0]}},
            {"prompt_token_ids": two, "multi_modal_data": {"image": [img[1], img[2]]}},
            {"prompt_token_ids": [1, 20, 21, 22]},
            {"prompt_token_ids": one, "multi_modal_data": {"image": img[2]}}]


def _jobs_of(runner):
    jobs = warmup.compile_jobs(runner)
    kinds = {}
    for key in jobs:
        kinds[key[0]] = kinds.get(key[0], 0) + 1
    return jobs, kinds


def test_qwen_vl_warmup_then_no_compilation_with_images(qwen_folder):
    llm = LLM(qwen_folder, **KW)
    runner = llm.llm_engine.runner
    jobs, kinds = _jobs_of(runner)
    assert kinds["encoder"] == 3  # patch buckets 64, 128, 256 (the processor's max_pixels)
    token_buckets = {t for _, t, _, _ in runner.warmup_shapes()}
    assert kinds["place"] == 3 * len(token_buckets)
    runner.warmup(progress=False, workers=1)
    c0 = CompileCounter.count
    outs = llm.generate(_qwen_workload(0), GREEDY, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 3 for o in outs)
    assert CompileCounter.count - c0 == 0, sorted(map(repr, runner.shapes_seen))
    stats = llm.llm_engine.encoder_cache.stats()
    assert stats["misses"] == 3 and stats["hits"] >= 1  # the largest image is asked twice


def test_qwen_vl_background_compile_covers_the_image_programs(qwen_folder):
    llm = LLM(qwen_folder, background_compile=True, **KW)
    runner = llm.llm_engine.runner
    pool = runner.compile_pool
    keys = set(warmup.compile_jobs(runner))
    assert {k[0] for k in keys} >= {"encoder", "place", "model"}
    first = llm.generate(_qwen_workload(10), GREEDY, use_tqdm=False)  # served meanwhile
    assert pool.wait(timeout=600) and not pool.failed
    c0 = CompileCounter.count
    again = llm.generate(_qwen_workload(10), GREEDY, use_tqdm=False)
    fresh = llm.generate(_qwen_workload(20), GREEDY, use_tqdm=False)  # new images, all sizes
    assert CompileCounter.count - c0 == 0
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    assert all(len(o.outputs[0].token_ids) == 3 for o in fresh)


def test_llava_warmup_then_no_compilation_with_images(tmp_path):
    vlm.save_tiny_llava(str(tmp_path))
    llm = LLM(str(tmp_path), **KW)
    runner = llm.llm_engine.runner
    jobs, kinds = _jobs_of(runner)
    assert kinds["encoder"] == 1
    runner.warmup(progress=False, workers=1)
    c0 = CompileCounter.count
    prompts = [{"prompt_token_ids": [1, 5, vlm.IMAGE_TOKEN, 7],
                "multi_modal_data": {"image": vlm.random_image(1)}},
               {"prompt_token_ids": [1, vlm.IMAGE_TOKEN, 6, vlm.IMAGE_TOKEN],
                "multi_modal_data": {"image": [vlm.random_image(2), vlm.random_image(3)]}},
               {"prompt_token_ids": [1, 30, 31]}]
    llm.generate(prompts, GREEDY, use_tqdm=False)
    assert CompileCounter.count - c0 == 0
