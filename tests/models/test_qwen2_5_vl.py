"""Qwen2.5-VL (models/qwen2_5_vl.py, models/qwen2_5_vl_vision.py) against transformers'
Qwen2_5_VLForConditionalGeneration, tiny and random, built and saved in the test:
the vision tower (window attention, 2D rotary, patch merger) on images of two sizes,
the M-RoPE positions, and the logits with one and two images.

Tolerance: 2e-4 * max(1, max|ref|) (float32 on both sides).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import pagedjax.models as models
from pagedjax.core.mm_item import MMItem
from pagedjax.models.metadata import SeqChunk, build_metadata
from tests.utils import qwen_vl as Q
from tests.utils import vlm

torch = pytest.importorskip("torch")

SIZES = [(40, 32), (23, 19)]  # (width, height): grids 8 x 10 and 4 x 6 patches


def _close(ours, ref, what):
    tol = 2e-4 * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(np.asarray(ours) - ref).max())
    assert err <= tol, f"{what}: max |diff| {err:.3g} > {tol:.3g}"


@pytest.fixture(scope="module")
def qwen_vl(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen_vl"))
    hf_model = Q.save_tiny_qwen_vl(folder)
    model, params = models.load_model(folder, dtype="float32")
    return folder, hf_model, model, params


def _items(model, ids, inputs):
    """MMItems of the prompt (as the engine's processor makes them)."""
    pairs = model.abstract.image_items(inputs)
    starts = [i for i, t in enumerate(ids) if t == Q.IMAGE_TOKEN and ids[i - 1] != Q.IMAGE_TOKEN]
    return tuple(MMItem(f"h{k}", s, n, d) for k, ((d, n), s) in enumerate(zip(pairs, starts)))


@pytest.mark.parametrize("query_block", [1024, 32])  # 32: queries attend block by block
def test_vision_tower_matches_transformers(qwen_vl, query_block, monkeypatch):
    from pagedjax.models import qwen2_5_vl_vision

    monkeypatch.setattr(qwen2_5_vl_vision, "QUERY_BLOCK", query_block)
    folder, hf_model, model, params = qwen_vl
    assert model.is_multimodal and model.uses_mrope
    images = [vlm.random_image(1, SIZES[0]), vlm.random_image(2, SIZES[1])]
    inputs = Q.hf_inputs(images)
    with torch.no_grad():
        ref = hf_model.model.get_image_features(
            torch.tensor(inputs["pixel_values"]),
            torch.tensor(inputs["image_grid_thw"])).pooler_output
    for (data, n), r in zip(model.abstract.image_items(inputs), ref):
        x = jax.tree.map(jnp.asarray, model.encoder_inputs(data))
        out = model.encode_images(params, x)
        assert out.shape[0] >= n == r.shape[0]
        _close(np.asarray(out)[:n], r.numpy(), f"image embeddings, grid {data['grid_thw']}")


@pytest.mark.parametrize("num_images", [1, 2])
def test_mrope_positions_match_transformers(qwen_vl, num_images):
    folder, hf_model, model, params = qwen_vl
    inputs = Q.hf_inputs([vlm.random_image(3 + i, SIZES[i]) for i in range(num_images)])
    ids = Q.prompt_ids(inputs["image_grid_thw"])
    t = torch.tensor([ids])
    ref, delta = hf_model.model.get_rope_index(
        t, (t == Q.IMAGE_TOKEN).int(), image_grid_thw=torch.tensor(inputs["image_grid_thw"]))
    table, ours_delta = model.abstract.mrope_positions(len(ids), _items(model, ids, inputs))
    np.testing.assert_array_equal(table, ref[:, 0].numpy())
    assert ours_delta == int(delta[0, 0]) != 0


@pytest.mark.parametrize("num_images", [1, 2])
def test_logits_match_transformers(qwen_vl, num_images):
    folder, hf_model, model, params = qwen_vl
    inputs = Q.hf_inputs([vlm.random_image(10 + i, SIZES[i]) for i in range(num_images)])
    ids = Q.prompt_ids(inputs["image_grid_thw"])
    items = _items(model, ids, inputs)
    rows, src = [], np.full(len(ids), -1, np.int32)
    base = 0
    for it in items:
        x = jax.tree.map(jnp.asarray, model.encoder_inputs(it.data))
        rows.append(np.asarray(model.encode_images(params, x))[:it.length])
        src[it.offset:it.end] = base + np.arange(it.length)
        base += it.length
    table, _ = model.abstract.mrope_positions(len(ids), items)
    pages = list(range(1, 1 + -(-len(ids) // 4)))
    meta = build_metadata([SeqChunk(pages, 0, len(ids))], 4)
    meta = dataclasses.replace(meta, mrope_positions=jnp.asarray(table))
    hidden, _ = jax.jit(model.forward)(params, model.allocate_kv_caches(len(pages) + 1, 4),
                                       jnp.asarray(ids, jnp.int32), meta,
                                       mm_embeds=(jnp.asarray(np.concatenate(rows)),
                                                  jnp.asarray(src)))
    ref = Q.hf_logits(hf_model, ids, inputs)
    _close(model.compute_logits(params, hidden), ref, f"logits, {num_images} image(s)")


def test_text_only_prompt_matches_transformers(qwen_vl):
    folder, hf_model, model, params = qwen_vl
    ids = [1, 5, 6, 7, 8, 20, 30]
    meta = build_metadata([SeqChunk([1, 2], 0, len(ids))], 4)
    hidden, _ = jax.jit(model.forward)(params, model.allocate_kv_caches(3, 4),
                                       jnp.asarray(ids, jnp.int32), meta)
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([ids])).logits[0].numpy()
    _close(model.compute_logits(params, hidden), ref, "text-only logits")


def test_bad_mrope_section_is_named(tmp_path):
    import json

    folder = str(tmp_path)
    Q.save_tiny_qwen_vl(folder)
    cfg = json.load(open(f"{folder}/config.json"))
    text = cfg.get("text_config", cfg)
    text["rope_parameters"]["mrope_section"] = [2, 2, 2]
    json.dump(cfg, open(f"{folder}/config.json", "w"))
    with pytest.raises(ValueError, match="mrope_section"):
        models.load_model(folder)


def test_flat_config_of_released_checkpoints_loads_the_same(qwen_vl, tmp_path):
    """Released Qwen2.5-VL folders keep the text fields at the top level with
    ``rope_scaling: {type: mrope, mrope_section}`` and ``rope_theta``."""
    import json
    import shutil

    folder, hf_model, model, params = qwen_vl
    flat_dir = str(tmp_path / "flat")
    shutil.copytree(folder, flat_dir)
    cfg = json.load(open(f"{flat_dir}/config.json"))
    text = cfg.pop("text_config")
    rope = text.pop("rope_parameters")
    text.update(rope_theta=rope["rope_theta"],
                rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
    cfg["vision_config"]["model_type"] = "qwen2_5_vl"
    json.dump({**text, **cfg}, open(f"{flat_dir}/config.json", "w"))
    flat, flat_params = models.load_model(flat_dir, dtype="float32")
    assert flat.abstract.mrope_section == model.abstract.mrope_section == (2, 3, 3)
    assert flat.abstract.inv_freq == model.abstract.inv_freq
    for a, b in zip(jax.tree.leaves(flat_params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
