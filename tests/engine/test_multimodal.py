"""Images in the engine (LLaVA + SigLIP, tiny and random) against transformers' greedy
generation: one and two images per prompt, chunked prefill cutting inside an image,
text-only requests in the same batch, n > 1, preemption, the encoder cache, and
prefix caching keyed by the image (same image hits, another image misses)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedjax import LLM, SamplingParams
from tests.utils import vlm

torch = pytest.importorskip("torch")

N_IMG = (vlm.IMAGE_SIZE // vlm.PATCH) ** 2  # placeholder tokens per image ("full")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llava_engine"))
    return path, vlm.save_tiny_llava(path)


@pytest.fixture(scope="module")
def llm(folder):
    # A 16-token step budget: a 20-token prompt with an image at positions 2..17 is
    # cut after position 15, inside the image.
    return LLM(folder[0], num_pages=96, page_size=4, max_model_len=128,
               max_num_batched_tokens=16, max_num_seqs=8)


def hf_greedy(folder, hf_model, ids: list[int], images: list, k: int = 6) -> list[int]:
    full = []
    for t in ids:
        full.extend([vlm.IMAGE_TOKEN] * N_IMG if t == vlm.IMAGE_TOKEN else [t])
    kw = {}
    if images:
        kw["pixel_values"] = torch.tensor(vlm.hf_pixels(folder, images))
    with torch.no_grad():
        out = hf_model.generate(input_ids=torch.tensor([full]), max_new_tokens=k,
                                do_sample=False, **kw)
    return out[0, len(full):].tolist()


def _prompt(ids, images):
    p = {"prompt_token_ids": ids}
    if images:
        p["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
    return p


def test_mixed_batch_one_two_images_and_text_match_transformers(folder, llm):
    path, hf_model = folder
    img = [vlm.random_image(i, (20 + 3 * i, 17 + i)) for i in range(3)]
    cases = [([1, 5, vlm.IMAGE_TOKEN, 7, 8], [img[0]]),  # 20 tokens: chunk cut inside the image
             ([1, vlm.IMAGE_TOKEN, 10, vlm.IMAGE_TOKEN, 11], [img[1], img[2]]),
             ([1, 30, 31, 32, 33, 34], []),  # text only, same batch
             ([1, 40, vlm.IMAGE_TOKEN], [img[2]])]
    outs = llm.generate([_prompt(i, m) for i, m in cases], GREEDY, use_tqdm=False)
    for (ids, images), out in zip(cases, outs):
        assert out.outputs[0].token_ids == hf_greedy(path, hf_model, ids, images), (ids, len(images))
    assert len(outs[0].prompt_token_ids) == 4 + N_IMG > 16  # expanded, and chunked


def test_parallel_samples_with_an_image(folder, llm):
    path, hf_model = folder
    img = vlm.random_image(7)
    ids = [1, 6, vlm.IMAGE_TOKEN, 10]
    out = llm.generate(_prompt(ids, [img]), SamplingParams(n=2, temperature=0.0, max_tokens=5,
                                                           ignore_eos=True), use_tqdm=False)[0]
    ref = hf_greedy(path, hf_model, ids, [img], 5)
    assert [o.token_ids for o in out.outputs] == [ref, ref]


def test_prefix_cache_keys_include_the_image_and_encoder_cache_hits(folder, llm):
    path, hf_model = folder
    x, y = vlm.random_image(21), vlm.random_image(22)
    ids = [1, vlm.IMAGE_TOKEN, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    cache = llm.llm_engine.encoder_cache
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    first = llm.generate(_prompt(ids, [x]), params, use_tqdm=False)[0]
    hits, misses = cache.hits, cache.misses
    same = llm.generate(_prompt(ids, [x]), params, use_tqdm=False)[0]
    other = llm.generate(_prompt(ids, [y]), params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert same.num_cached_tokens >= 16  # pages of the same text and image are shared
    assert other.num_cached_tokens == 0  # same text, another image: no page shared
    assert same.outputs[0].token_ids == first.outputs[0].token_ids == \
        hf_greedy(path, hf_model, ids, [x])
    assert other.outputs[0].token_ids == hf_greedy(path, hf_model, ids, [y])
    lp = [o.outputs[0].cumulative_logprob for o in (first, same, other)]
    assert abs(lp[0] - lp[1]) < 1e-4 < abs(lp[0] - lp[2])  # the image matters
    # The repeated image's encoder output came from the cache (if its pages were not all
    # cached, the step read it there); the new image was encoded once.
    assert cache.misses == misses + 1 and cache.hits >= hits
    assert not cache.holders  # nothing held once the requests are done


def test_preemption_recomputes_images(folder):
    path, hf_model = folder
    llm = LLM(path, num_pages=20, page_size=4, max_model_len=96, max_num_batched_tokens=64,
              max_num_seqs=4, encoder_cache_size=0)
    imgs = [vlm.random_image(30 + i) for i in range(6)]
    cases = [([1, vlm.IMAGE_TOKEN, 3 + i, vlm.IMAGE_TOKEN, 4], imgs[2 * i:2 * i + 2])
             for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    outs = llm.generate([_prompt(i, m) for i, m in cases], params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for (ids, images), out in zip(cases, outs):
        assert out.outputs[0].token_ids == hf_greedy(path, hf_model, ids, images, 14)


def test_bad_image_inputs_are_named(folder, llm):
    with pytest.raises(ValueError, match="does not decode"):
        llm.generate(_prompt([1, vlm.IMAGE_TOKEN], [b"not an image"]), GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="placeholder"):
        llm.generate(_prompt([1, 5], [vlm.random_image(1)]), GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="pixels"):
        llm.generate(_prompt([1, vlm.IMAGE_TOKEN], [np.zeros((5000, 4000, 3), np.uint8)]),
                     GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="modality"):
        llm.generate({"prompt_token_ids": [1], "multi_modal_data": {"video": [1]}}, GREEDY,
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_limit_mm_per_prompt_and_text_only_model(folder, tmp_path):
    from tests.utils.spec_models import make_tiny_llama

    llm = LLM(folder[0], num_pages=48, page_size=4, max_model_len=96,
              limit_mm_per_prompt={"image": 1})
    two = _prompt([1, vlm.IMAGE_TOKEN, vlm.IMAGE_TOKEN], [vlm.random_image(1)] * 2)
    with pytest.raises(ValueError, match="limit_mm_per_prompt"):
        llm.generate(two, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="limit_mm_per_prompt"):
        LLM(folder[0], limit_mm_per_prompt={"image": -1})
    text = LLM(make_tiny_llama(str(tmp_path), 64, 1, 0), num_pages=16, max_model_len=64)
    with pytest.raises(ValueError, match="text-only"):
        text.generate(_prompt([1, 5], [vlm.random_image(1)]), GREEDY, use_tqdm=False)


def test_llm_chat_with_image_parts(folder, llm):
    import base64
    import io

    path, hf_model = folder
    img = vlm.random_image(44)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for part in ({"type": "image_pil", "image_pil": img},
                 {"type": "image_url", "image_url": {"url": url}}):
        out = llm.chat([{"role": "user", "content": [{"type": "text", "text": "w5 w6"}, part]}],
                       GREEDY, use_tqdm=False, chat_template=template)[0]
        # Rendered "w5 w6\nw9\n": tokens 5, 6 and the image's placeholders.
        assert out.outputs[0].token_ids == hf_greedy(path, hf_model, [5, 6, vlm.IMAGE_TOKEN],
                                                     [img])
