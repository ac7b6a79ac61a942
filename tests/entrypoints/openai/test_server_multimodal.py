"""Chat completions with images (OpenAI ``image_url`` parts) on a tiny random LLaVA,
through the official ``openai`` client: data: URLs, http URLs from the allowed
domains only (a loopback HTTP server shows a refused URL makes no connection), and a
clear 400 for every bad image input."""

from __future__ import annotations

import base64
import http.server
import io
import json
import threading

import openai
import pytest

from tests.utils import vlm
from tests.utils.server import start_server, stop_server

torch = pytest.importorskip("torch")

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


class _Images(http.server.ThreadingHTTPServer):
    connections = 0

    def process_request(self, request, client_address):
        type(self).connections += 1
        super().process_request(request, client_address)


@pytest.fixture(scope="module")
def image_server():
    body = png(vlm.random_image(5))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = _Images(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1], body
    srv.shutdown()


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("llava_server"))
    hf_model = vlm.save_tiny_llava(folder)
    cfg_path = f"{folder}/tokenizer_config.json"
    cfg = json.load(open(cfg_path))
    cfg["chat_template"] = TEMPLATE
    json.dump(cfg, open(cfg_path, "w"))
    srv = start_server(["--model", folder, "--max-model-len", "128", "--page-size", "4",
                        "--allowed-media-domains", "localhost",
                        "--limit-mm-per-prompt", '{"image": 2}', "--max-image-pixels", "5000"])
    try:
        yield srv, folder, hf_model
    finally:
        stop_server(srv)


def _ask(client, parts, **kw):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, temperature=0.0, max_tokens=5,
        messages=[{"role": "user", "content": parts}], **kw)


def _hf_words(folder, hf_model, ids, images) -> list[str]:
    full = []
    for t in ids:
        full.extend([vlm.IMAGE_TOKEN] * 16 if t == vlm.IMAGE_TOKEN else [t])
    px = torch.tensor(vlm.hf_pixels(folder, images))
    with torch.no_grad():
        out = hf_model.generate(input_ids=torch.tensor([full]), pixel_values=px,
                                max_new_tokens=5, do_sample=False)
    return [f"w{t}" for t in out[0, len(full):].tolist()]


def test_openai_client_base64_image_answer_matches_transformers(vlm_server):
    srv, folder, hf_model = vlm_server
    img = vlm.random_image(3)
    r = _ask(srv.client(), [{"type": "text", "text": "w5 w6"},
                            {"type": "image_url", "image_url": {"url": data_url(png(img))}}])
    # Rendered "w5 w6\nw9\n": tokens 5, 6 and the image's placeholders.
    assert r.choices[0].message.content.split() == _hf_words(folder, hf_model, [5, 6, vlm.IMAGE_TOKEN], [img])


def test_streaming_with_an_image_equals_the_whole_answer(vlm_server):
    srv, _, _ = vlm_server
    parts = [{"type": "text", "text": "w4"},
             {"type": "image_url", "image_url": {"url": data_url(png(vlm.random_image(8)))}}]
    client = srv.client()
    whole = _ask(client, parts).choices[0].message.content
    chunks = _ask(client, parts, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole and whole


def test_url_from_allowed_domain_fetched_other_refused_without_connection(vlm_server,
                                                                          image_server):
    srv, folder, hf_model = vlm_server
    port, _ = image_server
    client = srv.client()
    before = _Images.connections
    r = _ask(client, [{"type": "image_url",
                       "image_url": {"url": f"http://localhost:{port}/cat.png"}}])
    assert r.choices[0].message.content and _Images.connections == before + 1
    with pytest.raises(openai.BadRequestError, match="allowed-media-domains"):
        _ask(client, [{"type": "image_url",
                       "image_url": {"url": f"http://127.0.0.1:{port}/cat.png"}}])
    assert _Images.connections == before + 1  # refused before connecting
    with pytest.raises(openai.BadRequestError, match="allowed-local-media-path"):
        _ask(client, [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}])


@pytest.mark.parametrize("parts,match", [
    ([{"type": "image_url", "image_url": {"url": data_url(b"not an image")}}], "does not decode"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], "base64"),
    ([{"type": "image_url", "image_url": {"url": "x"}}] * 3, "limit_mm_per_prompt"),
    ([{"type": "image_url", "image_url": {"url": "gopher://h/x"}}], "scheme"),
])
def test_bad_images_are_400(vlm_server, parts, match):
    srv, _, _ = vlm_server
    with pytest.raises(openai.BadRequestError, match=match) as e:
        _ask(srv.client(), parts)
    assert e.value.status_code == 400


def test_too_many_pixels_is_400(vlm_server):
    srv, _, _ = vlm_server
    big = data_url(png(vlm.random_image(1, (100, 100))))  # 10000 > --max-image-pixels 5000
    with pytest.raises(openai.BadRequestError, match="pixels"):
        _ask(srv.client(), [{"type": "image_url", "image_url": {"url": big}}])
    assert srv.raw("GET", "/health", auth=False)[0] == 200


def test_image_to_text_only_model_is_400(server):
    url = data_url(png(vlm.random_image(1)))
    with pytest.raises(openai.BadRequestError, match="text-only") as e:
        _ask(server.client(), [{"type": "text", "text": "what is this?"},
                               {"type": "image_url", "image_url": {"url": url}}])
    assert e.value.status_code == 400


def test_structured_outputs_with_an_unreadable_tokenizer_is_400(vlm_server):
    """The tiny model's WordPiece tokenizer is one the grammar library cannot read: the
    server still starts, and a constrained request is a 400 that says why."""
    import openai

    srv, _, _ = vlm_server
    with pytest.raises(openai.BadRequestError, match="not available for this model"):
        srv.client().chat.completions.create(
            model=srv.client().models.list().data[0].id, max_tokens=4,
            messages=[{"role": "user", "content": "w5"}],
            response_format={"type": "json_object"})
