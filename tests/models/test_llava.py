"""LLaVA with a SigLIP tower (models/llava.py, models/siglip.py) against transformers'
LlavaForConditionalGeneration, tiny and random, built and saved in the test.

Tolerance: 2e-4 * max(1, max|ref|) (float32 on both sides).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import pagedjax.models as models
from pagedjax.models.metadata import SeqChunk, build_metadata
from tests.utils import vlm

torch = pytest.importorskip("torch")


def _close(ours, ref, what):
    tol = 2e-4 * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(np.asarray(ours) - ref).max())
    assert err <= tol, f"{what}: max |diff| {err:.3g} > {tol:.3g}"


@pytest.fixture(scope="module", params=["full", "default"])
def llava(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(f"llava_{request.param}"))
    hf_model = vlm.save_tiny_llava(folder, strategy=request.param)
    model, params = models.load_model(folder, dtype="float32")
    return folder, hf_model, model, params


def _hf_image_features(hf_model, px):
    with torch.no_grad():
        out = hf_model.model.get_image_features(torch.tensor(px))
    out = getattr(out, "pooler_output", out)
    return torch.stack(list(out)).numpy()


def test_vision_embeddings_match_transformers(llava):
    folder, hf_model, model, params = llava
    assert model.is_multimodal and model.info.architecture == "LlavaForConditionalGeneration"
    px = vlm.hf_pixels(folder, [vlm.random_image(1), vlm.random_image(2, (40, 30))])
    ours = model.encode_images(params, jnp.asarray(px))
    ref = _hf_image_features(hf_model, px)
    assert ours.shape == ref.shape == (2, model.abstract.mm_tokens_per_image, 64)
    _close(ours, ref, "image embeddings")


@pytest.mark.parametrize("num_images", [1, 2])
def test_logits_match_transformers(llava, num_images):
    folder, hf_model, model, params = llava
    px = vlm.hf_pixels(folder, [vlm.random_image(10 + i) for i in range(num_images)])
    n = model.abstract.mm_tokens_per_image
    ids = [1, 5, 6]
    for i in range(num_images):
        ids += [vlm.IMAGE_TOKEN] * n + [7 + i, 8]
    emb = np.asarray(model.encode_images(params, jnp.asarray(px))).reshape(-1, 64)
    src = np.full(len(ids), -1, np.int32)
    where = [i for i, t in enumerate(ids) if t == vlm.IMAGE_TOKEN]
    src[where] = np.arange(len(where))
    pages = list(range(1, 1 + -(-len(ids) // 4)))
    meta = build_metadata([SeqChunk(pages, 0, len(ids))], 4)
    hidden, _ = jax.jit(model.forward)(params, model.allocate_kv_caches(len(pages) + 1, 4),
                                       jnp.asarray(ids, jnp.int32), meta,
                                       mm_embeds=(jnp.asarray(emb), jnp.asarray(src)))
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(px)).logits[0]
    _close(model.compute_logits(params, hidden), ref.numpy(), f"logits, {num_images} image(s)")


def test_unsupported_vision_tower_is_named(tmp_path):
    import json

    folder = str(tmp_path)
    vlm.save_tiny_llava(folder)
    cfg = json.load(open(f"{folder}/config.json"))
    cfg["vision_config"]["model_type"] = "clip_vision_model"
    json.dump(cfg, open(f"{folder}/config.json", "w"))
    with pytest.raises(ValueError, match="vision_config.model_type"):
        models.load_model(folder)
