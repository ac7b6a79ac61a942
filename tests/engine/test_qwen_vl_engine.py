"""Qwen2.5-VL in the engine (tiny and random) against transformers' greedy generation:
M-RoPE positions carried through the continuous batch (prompt table, then position +
delta while decoding), one and two images of different sizes, a text-only request in
the same batch, chunked prefill cutting inside an image, and prefix caching keyed by
the image (the same image hits, another misses, both give transformers' tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedjax import LLM, SamplingParams
from tests.utils import qwen_vl as Q
from tests.utils import vlm

torch = pytest.importorskip("torch")

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
SIZES = [(40, 32), (23, 19), (30, 40)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen_vl_engine"))
    return path, Q.save_tiny_qwen_vl(path)


@pytest.fixture(scope="module")
def llm(folder):
    # A 16-token step budget: every image here has more tokens, so prompts are cut
    # inside their images.
    return LLM(folder[0], num_pages=128, page_size=4, max_model_len=256,
               max_num_batched_tokens=16, max_num_seqs=8)


def _short_ids(n_images: int, text=(5, 6)) -> list[int]:
    """The prompt with one placeholder per image (the engine expands it)."""
    ids = [1, *text]
    for i in range(n_images):
        ids += [Q.VISION_START, Q.IMAGE_TOKEN, Q.VISION_END, 7 + i, 8]
    return ids


def _reference(hf_model, images, text=(5, 6), k: int = 6, ids=None):
    """(expanded prompt ids, greedy tokens, log-softmax of the first generated token);
    ``ids``: the prompt with one placeholder per image (default: ``_short_ids``)."""
    if not images:
        ids = [1, *text]
        with torch.no_grad():
            out = hf_model.generate(input_ids=torch.tensor([ids]), max_new_tokens=k,
                                    do_sample=False)
            logits = hf_model(input_ids=torch.tensor([ids])).logits[0, -1].numpy()
        return ids, out[0, len(ids):].tolist(), logits
    inputs = Q.hf_inputs(images)
    if ids is None:
        ids = Q.prompt_ids(inputs["image_grid_thw"], text)
    else:
        counts = iter(Q.tokens_of(g) for g in inputs["image_grid_thw"])
        ids = [x for t in ids for x in ([t] * next(counts) if t == Q.IMAGE_TOKEN else [t])]
    tokens = Q.hf_greedy(hf_model, ids, inputs, k)
    return ids, tokens, Q.hf_logits(hf_model, ids, inputs)[-1]


def _prompt(images, text=(5, 6), salt=None):
    p = {"prompt_token_ids": _short_ids(len(images), text)}
    if images:
        p["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
    if salt is not None:
        p["cache_salt"] = salt
    return p


def _check(out, ref, what):
    ids, tokens, last_logits = ref
    assert out.prompt_token_ids == ids, f"{what}: expanded prompt"
    assert out.outputs[0].token_ids == tokens, f"{what}: greedy tokens"
    lp = last_logits - np.log(np.exp(last_logits - last_logits.max()).sum()) - last_logits.max()
    first = out.outputs[0].logprobs[0][tokens[0]].logprob
    assert abs(first - lp[tokens[0]]) < 2e-4 * max(1.0, abs(lp[tokens[0]])), what


def test_mixed_batch_one_two_images_and_text_match_transformers(folder, llm):
    _, hf_model = folder
    img = [vlm.random_image(20 + i, SIZES[i]) for i in range(3)]
    cases = [[img[0]], [img[1], img[2]], [], [img[2]]]
    outs = llm.generate([_prompt(c) for c in cases], GREEDY, use_tqdm=False)
    for case, out in zip(cases, outs):
        _check(out, _reference(hf_model, case), f"{len(case)} image(s)")
    assert llm.llm_engine.pool_stats().used == 0


def test_prefix_cache_same_image_hits_other_image_misses(folder, llm):
    _, hf_model = folder
    a, b = vlm.random_image(40, SIZES[0]), vlm.random_image(41, SIZES[0])
    text = tuple(range(30, 50))  # 20 text tokens before the image: whole cached pages
    first = llm.generate(_prompt([a], text), GREEDY, use_tqdm=False)[0]
    hit = llm.generate(_prompt([a], text), GREEDY, use_tqdm=False)[0]
    miss = llm.generate(_prompt([b], text), GREEDY, use_tqdm=False)[0]
    ref_a, ref_b = _reference(hf_model, [a], text), _reference(hf_model, [b], text)
    for out, ref, what in ((first, ref_a, "first"), (hit, ref_a, "hit"), (miss, ref_b, "miss")):
        _check(out, ref, what)
    assert hit.num_cached_tokens >= len(ref_a[0]) - 4  # every whole page of the prompt
    assert miss.num_cached_tokens == 0


def test_llm_chat_with_two_image_parts_matches_transformers(folder, llm):
    _, hf_model = folder
    a, b = vlm.random_image(50, SIZES[1]), vlm.random_image(51, SIZES[2])
    content = [{"type": "text", "text": "w5 w6"}, {"type": "image_pil", "image_pil": a},
               {"type": "text", "text": "w7"}, {"type": "image_pil", "image_pil": b}]
    out = llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)[0]
    # "w5 w6<|vision_start|><|image_pad|><|vision_end|>w7<|vision_start|>...": each image
    # inline between its vision start and end tokens (as Qwen's template writes it),
    # expanded to its own number of placeholders.
    short = [5, 6, Q.VISION_START, Q.IMAGE_TOKEN, Q.VISION_END, 7,
             Q.VISION_START, Q.IMAGE_TOKEN, Q.VISION_END]
    _check(out, _reference(hf_model, [a, b], ids=short), "chat, two images")


def test_parallel_samples_and_preemption_keep_mrope_positions(folder):
    """n = 2 forks share the prompt's M-RoPE table; a preempted request recomputes its
    prompt (images encoded again: no encoder cache reserve) at the same positions."""
    path, hf_model = folder
    llm = LLM(path, num_pages=28, page_size=4, max_model_len=128, max_num_batched_tokens=32,
              max_num_seqs=4, encoder_cache_size=0)
    imgs = [vlm.random_image(80 + i, SIZES[i % 2]) for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([_prompt([m]) for m in imgs], params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for img, out in zip(imgs, outs):
        assert out.outputs[0].token_ids == _reference(hf_model, [img], k=16)[1]
    forked = llm.generate(_prompt([imgs[0]]), SamplingParams(temperature=0.0, max_tokens=5, n=2,
                                                            ignore_eos=True), use_tqdm=False)[0]
    ref = _reference(hf_model, [imgs[0]], k=5)[1]
    assert [c.token_ids for c in forked.outputs] == [ref, ref]


def test_bad_image_inputs_are_named(folder, llm):
    with pytest.raises(ValueError, match="image processor"):  # aspect ratio over 200
        llm.generate(_prompt([np.zeros((2, 600, 3), np.uint8)]), GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="placeholder"):
        llm.generate({"prompt_token_ids": [1, 5], "multi_modal_data": {
            "image": vlm.random_image(1)}}, GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_images_served_without_torch(folder, llm):
    """The image processor's PIL/numpy backend: a process where ``import torch`` fails
    gives the same tokens."""
    import json
    import subprocess
    import sys

    from tests.utils.paths import REPO_ROOT

    img = vlm.random_image(90, SIZES[0])
    img.save(f"{folder[0]}/probe.png")
    code = (
        "import sys, json\n"
        "sys.modules['torch'] = None; sys.modules['torchvision'] = None\n"
        "from PIL import Image\n"
        "from pagedjax import LLM, SamplingParams\n"
        f"llm = LLM({folder[0]!r}, num_pages=64, page_size=4, max_model_len=128)\n"
        f"p = {{'prompt_token_ids': {_short_ids(1)!r},\n"
        f"     'multi_modal_data': {{'image': Image.open({folder[0] + '/probe.png'!r})}}}}\n"
        "out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),\n"
        "                   use_tqdm=False)\n"
        "print(json.dumps(out[0].outputs[0].token_ids))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(REPO_ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokens = json.loads(proc.stdout.strip().splitlines()[-1])
    want = llm.generate(_prompt([img]), SamplingParams(temperature=0.0, max_tokens=4,
                                                       ignore_eos=True), use_tqdm=False)
    assert tokens == want[0].outputs[0].token_ids
