"""Qwen2_5_VLForConditionalGeneration: the Qwen2.5-VL vision tower
(``models/qwen2_5_vl_vision.py``: window attention, 2D rotary, the patch merger) and
a Qwen2 text model whose rotary is multimodal (M-RoPE).

Images have their own size: the image processor (``Qwen2VLImageProcessorPil``)
resizes each to a multiple of 28 pixels and gives its patches and grid ``(1, gh, gw)``;
the image takes ``gh * gw / 4`` placeholder tokens (``image_token_id``), usually
between ``<|vision_start|>`` and ``<|vision_end|>``.

M-RoPE: each token has three positions (temporal, row, column). Text tokens have
the same value in all three, counting on from the largest position before them; an
image's tokens have ``start`` (t), ``start + row`` and ``start + column``, and the
text after the image continues from ``start + max(rows, columns)``. The rotary
frequencies are split by ``mrope_section`` (t, h, w: sums to head_dim / 2), each part
rotated by its own position row. :meth:`mrope_positions` computes a prompt's table
once (host side); a generated token at sequence position ``p`` has ``p + delta`` in
all three rows, ``delta`` = (largest prompt position + 1) - prompt length. The step
reads them from ``AttentionMetadata.mrope_positions`` (i32[3, T]); without it (no
images) the three rows are the plain positions.

State: the Qwen2 state (``models/llama.py``) plus ``visual.*`` (the tower).
HF names (transformers >= 5): ``model.language_model.*``, ``model.visual.*``,
``lm_head.weight``; older checkpoints: ``model.*``, ``visual.*``.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan
from pagedjax.models.common import ConfigReader, WeightSpec
from pagedjax.models.qwen2 import Qwen2ForCausalLM
from pagedjax.models.qwen2_5_vl_vision import Qwen2_5_VisionTower


def _text_config(config: dict) -> dict:
    """The text model's config: ``text_config`` (transformers >= 5) or the top level."""
    text = config.get("text_config")
    text = dict(text) if isinstance(text, dict) else {
        k: v for k, v in config.items() if k not in ("vision_config", "architectures")}
    for key in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):
        if text.get(key) is None and config.get(key) is not None:
            text[key] = config[key]
    return text


def mrope_section(text: dict, head_dim: int) -> tuple[int, int, int]:
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    sec = tuple(int(s) for s in rope.get("mrope_section", (16, 24, 24)))
    if len(sec) != 3 or sum(sec) != head_dim // 2:
        raise ValueError(f"Qwen2_5_VLForConditionalGeneration config: mrope_section={list(sec)} "
                         f"must be three parts summing to head_dim / 2 = {head_dim // 2}")
    return sec


class Qwen2_5_VLForConditionalGeneration(Qwen2ForCausalLM):
    architecture = "Qwen2_5_VLForConditionalGeneration"
    supports_lora = False
    uses_mrope = True  # the engine carries 3 position rows (AttentionMetadata.mrope_positions)
    checkpoint_aliases = {"model.language_model.": ("model.",), "model.visual.": ("visual.",)}

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        c = ConfigReader(dict(config), self.architecture)
        text = _text_config(c.config)
        text = {**text, "rope_scaling": None,
                "rope_parameters": {k: v for k, v in (text.get("rope_parameters") or {}).items()
                                    if k not in ("mrope_section", "rope_type", "type")}
                or None}
        if text["rope_parameters"] is not None:
            text["rope_parameters"]["rope_type"] = "default"
        super().__init__(text, dtype=dtype, rngs=rngs)
        self.mrope_section = mrope_section(_text_config(c.config), self.head_dim)
        vision = dict(c.require("vision_config"))
        vision.setdefault("out_hidden_size", self.hidden_size)
        self.visual = Qwen2_5_VisionTower(vision, dtype=dtype)
        if self.visual.out_hidden_size != self.hidden_size:
            raise c.unsupported("vision_config.out_hidden_size", self.visual.out_hidden_size,
                                f"must equal the text hidden_size {self.hidden_size}")
        self.image_token_id = int(c.get("image_token_id", 151655))
        # What a chat message's image part becomes: <|vision_start|><|image_pad|><|vision_end|>.
        self.image_placeholder_ids = (int(c.get("vision_start_token_id", 151652)),
                                      self.image_token_id,
                                      int(c.get("vision_end_token_id", 151653)))
        self.merge_unit = self.visual.merge**2

    # -- host side: images and positions -------------------------------------------------

    def image_items(self, processed: dict) -> list[tuple[dict, int]]:
        """The image processor's output -> (encoder data, placeholder tokens) per image."""
        px = np.asarray(processed["pixel_values"], np.float32)
        out, off = [], 0
        for grid in np.asarray(processed["image_grid_thw"]).reshape(-1, 3):
            n = int(np.prod(grid))
            out.append(({"pixel_values": px[off:off + n], "grid_thw": tuple(int(g) for g in grid)},
                        n // self.merge_unit))
            off += n
        return out

    def encoder_inputs(self, data: dict) -> dict:
        """One image's encoder data -> the tower's inputs at its patch bucket (numpy)."""
        return self.visual.encoder_inputs(data["pixel_values"], data["grid_thw"])

    def encoder_warmup_data(self, max_patches: int | None) -> list[dict]:
        """Encoder data of one image per patch bucket an image of at most ``max_patches``
        patches can use (zeros; for compiling the encoder ahead of time)."""
        from pagedjax.models.qwen2_5_vl_vision import MIN_PATCH_BUCKET, patch_bucket

        v = self.visual
        k = v.channels * v.temporal_patch_size * v.patch_size**2
        out, b = [], MIN_PATCH_BUCKET
        while b <= patch_bucket(max_patches or MIN_PATCH_BUCKET):
            out.append({"pixel_values": np.zeros((b, k), np.float32),
                        "grid_thw": (1, v.merge, b // v.merge)})
            b *= 2
        return out

    def mrope_positions(self, num_tokens: int, items: Sequence) -> tuple[np.ndarray, int] | None:
        """A prompt's M-RoPE positions (i32[3, num_tokens], delta) from its images
        (MMItems by offset, ``data["grid_thw"]``); None without images."""
        if not items:
            return None
        pos = np.empty((3, num_tokens), np.int64)
        cur = prev = 0
        m = self.visual.merge
        for it in items:
            pos[:, prev:it.offset] = cur + np.arange(it.offset - prev)
            cur += it.offset - prev
            t, gh, gw = it.data["grid_thw"]
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh // m), np.arange(gw // m),
                                     indexing="ij")
            pos[:, it.offset:it.end] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + cur
            cur += max(gh, gw) // m
            prev = it.end
        pos[:, prev:] = cur + np.arange(num_tokens - prev)
        return pos.astype(np.int32), int(pos.max()) + 1 - num_tokens

    # -- device side -------------------------------------------------------------------

    def encode_images(self, inputs: dict, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:
        """The tower's inputs (:meth:`encoder_inputs`) -> [patch bucket / 4, H]."""
        return self.visual(inputs, plan)

    def embed(self, token_ids: jax.Array, meta: AttentionMetadata,
              plan: ExecutionPlan = DEFAULT_PLAN):
        x = self.embed_tokens(token_ids)
        pos = getattr(meta, "mrope_positions", None)
        if pos is None:
            pos = jnp.broadcast_to(meta.positions, (3,) + meta.positions.shape)
        sec = np.repeat(np.arange(3), self.mrope_section)  # frequency j -> its position row
        chosen = pos[sec].astype(jnp.float32)  # [D/2, T]
        angles = chosen.T * jnp.asarray(self.inv_freq, jnp.float32)[None, :]
        return x, (jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype))

    def weight_map(self) -> dict:
        out = {}
        for key, spec in super().weight_map().items():
            names = tuple("model.language_model." + n[len("model."):] if n.startswith("model.")
                          else n for n in spec.names)
            out[key] = WeightSpec(names, spec.fn)
        out.update(self.visual.weight_map("model.visual.", "visual."))
        return out
