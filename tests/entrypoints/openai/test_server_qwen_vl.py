"""Chat completions with images on a tiny random Qwen2.5-VL through the official
``openai`` client: the answer equals transformers' greedy tokens, streaming gives the
same text, and ``usage.prompt_tokens`` counts every image placeholder token (the
expanded prompt, as vLLM counts it)."""

from __future__ import annotations

import base64
import io

import pytest

from tests.utils import qwen_vl as Q
from tests.utils import vlm
from tests.utils.server import start_server, stop_server

torch = pytest.importorskip("torch")


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen_vl_server"))
    hf_model = Q.save_tiny_qwen_vl(folder)
    srv = start_server(["--model", folder, "--max-model-len", "256", "--page-size", "4",
                        "--limit-mm-per-prompt", '{"image": 2}'])
    try:
        yield srv, hf_model
    finally:
        stop_server(srv)


def _ask(client, parts, **kw):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, temperature=0.0, max_tokens=5,
        messages=[{"role": "user", "content": parts}], **kw)


def test_base64_images_answer_and_usage_match_transformers(qwen_server):
    srv, hf_model = qwen_server
    a, b = vlm.random_image(60, (40, 32)), vlm.random_image(61, (23, 19))
    r = _ask(srv.client(), [{"type": "text", "text": "w5 w6"},
                            {"type": "image_url", "image_url": {"url": data_url(a)}},
                            {"type": "image_url", "image_url": {"url": data_url(b)}}])
    inputs = Q.hf_inputs([a, b])
    ids = [5, 6]
    for g in inputs["image_grid_thw"]:
        ids += [Q.VISION_START] + [Q.IMAGE_TOKEN] * Q.tokens_of(g) + [Q.VISION_END]
    expected = [f"w{t}" for t in Q.hf_greedy(hf_model, ids, inputs, 5)]
    assert r.choices[0].message.content.split() == expected
    assert r.usage.prompt_tokens == len(ids) == 2 + (1 + 20 + 1) + (1 + 6 + 1)  # placeholders too
    assert r.usage.completion_tokens == 5


def test_streaming_with_an_image_equals_the_whole_answer(qwen_server):
    srv, _ = qwen_server
    parts = [{"type": "text", "text": "w4"},
             {"type": "image_url", "image_url": {"url": data_url(vlm.random_image(62))}}]
    client = srv.client()
    whole = _ask(client, parts).choices[0].message.content
    chunks = _ask(client, parts, stream=True, stream_options={"include_usage": True})
    chunks = list(chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole and whole
    usage = [c.usage for c in chunks if c.usage is not None][-1]
    assert usage.prompt_tokens == 1 + 2 + Q.tokens_of(Q.hf_inputs([vlm.random_image(62)])[
        "image_grid_thw"][0])
