"""Images of a request -> placeholder tokens in its prompt + encoder inputs (host side).

    proc = MultiModalProcessor.for_model(folder, model, limits={"image": 4})
    ids, items = proc.process(prompt_ids, {"image": [img1, img2]})

Images are PIL images, numpy arrays (H, W, C uint8) or encoded bytes. Each one is
preprocessed by the model folder's transformers image processor (its PIL/numpy
backend: no torch at run time), hashed by content (mode, size and pixels), and
takes its placeholder tokens (``image_token_id``) in the prompt: ``tokens_per_image``
for models whose images all have one size, else as many as the model's
``image_items`` says for the image as the processor resized it (Qwen2.5-VL). The
prompt names each image by one placeholder token (expanded here, as vLLM's
processors do) or by the whole run of them. Every error is a ValueError that
names the argument.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, Sequence

import numpy as np

from pagedjax.core.mm_item import MMItem
from pagedjax.core.mm_limits import SUPPORTED_MODALITIES, parse_limits

DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096


def load_image(obj: Any, index: int, max_pixels: int):
    """A PIL RGB image from a PIL image, an H x W x C array or encoded bytes."""
    from PIL import Image, UnidentifiedImageError

    where = f"multi_modal_data['image'][{index}]"
    if isinstance(obj, (bytes, bytearray)):
        try:
            img = Image.open(io.BytesIO(obj))
        except (UnidentifiedImageError, OSError) as e:
            raise ValueError(f"{where}: the image does not decode ({e})") from None
    elif isinstance(obj, np.ndarray):
        if obj.ndim not in (2, 3) or obj.size == 0:
            raise ValueError(f"{where}: an array image must be H x W or H x W x C, "
                             f"got shape {obj.shape}")
        arr = obj if obj.dtype == np.uint8 else np.clip(obj * 255.0, 0, 255).astype(np.uint8)
        img = Image.fromarray(arr)
    elif isinstance(obj, Image.Image):
        img = obj
    else:
        raise ValueError(f"{where}: expected a PIL image, a numpy array or encoded bytes, "
                         f"got {type(obj).__name__}")
    w, h = img.size
    if w * h > max_pixels:
        raise ValueError(f"{where}: the image has {w}x{h} = {w * h} pixels, more than the "
                         f"limit of {max_pixels}; send a smaller image")
    try:
        return img.convert("RGB")
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: the image does not decode ({e})") from None


def content_hash(img) -> str:
    """The image's identity for the encoder cache and the prefix cache."""
    h = hashlib.sha256()
    h.update(f"{img.mode}|{img.size[0]}x{img.size[1]}|".encode())
    h.update(img.tobytes())
    return h.hexdigest()[:32]


class MultiModalProcessor:
    """The image side of one vision-language model (see the module docstring)."""

    def __init__(self, image_processor, image_token_id: int, tokens_per_image: int | None,
                 limits: dict[str, int] | None = None,
                 max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, image_items=None):
        self.image_processor = image_processor
        self.image_token_id = int(image_token_id)
        # Fixed-size images (LLaVA): tokens per image; None when each image has its own.
        self.tokens_per_image = None if tokens_per_image is None else int(tokens_per_image)
        # The tokens an image part of a chat message becomes (the image token, or with
        # the model's vision start / end tokens around it).
        self.placeholder_ids: tuple[int, ...] = (self.image_token_id,)
        # The module's split of the processor output into (encoder data, tokens) per
        # image (models with images of their own size); None: pixel_values[k] each.
        self.image_items = image_items
        self.limits = dict(limits or {})
        self.max_image_pixels = int(max_image_pixels)

    @classmethod
    def for_model(cls, folder: str, module, limits=None,
                  max_image_pixels: int | None = None) -> "MultiModalProcessor":
        """From an HF folder's ``preprocessor_config.json`` and the (abstract) module."""
        import transformers

        try:
            proc = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
        except TypeError:
            proc = transformers.AutoImageProcessor.from_pretrained(folder)
        except OSError as e:
            raise ValueError(f"{folder}: the vision-language model has no image processor "
                             f"(preprocessor_config.json): {e}") from None
        out = cls(proc, module.image_token_id, getattr(module, "mm_tokens_per_image", None),
                  parse_limits(limits), max_image_pixels or DEFAULT_MAX_IMAGE_PIXELS,
                  getattr(module, "image_items", None))
        out.placeholder_ids = tuple(getattr(module, "image_placeholder_ids", out.placeholder_ids))
        return out

    def placeholder_text(self, tokenizer) -> str:
        """The text standing for one image part of a chat message: the image token on a
        line of its own, or, for models whose templates write the image inline between
        vision start / end tokens (Qwen2.5-VL), those tokens as the template writes them."""
        text = "".join(tokenizer.convert_ids_to_tokens(list(self.placeholder_ids)))
        return text if len(self.placeholder_ids) > 1 else f"\n{text}\n"

    def max_image_patches(self) -> int | None:
        """Most patches the image processor makes of one image (its largest pixel count
        over the patch area), None for processors that resize to one fixed size."""
        size = getattr(self.image_processor, "size", None)
        patch = getattr(self.image_processor, "patch_size", None)
        longest = getattr(size, "longest_edge", None)
        if longest is None and isinstance(size, dict):
            longest = size.get("longest_edge")
        if not longest or not patch:
            return None
        return int(longest) // int(patch) ** 2

    def check_count(self, n: int) -> None:
        limit = self.limits.get("image")
        if limit is not None and n > limit:
            raise ValueError(f"multi_modal_data: {n} images in one prompt, more than "
                             f"limit_mm_per_prompt={{'image': {limit}}}; send at most {limit}")

    def process(self, ids: Sequence[int], mm_data: Any) -> tuple[list[int], tuple[MMItem, ...]]:
        """(prompt ids with each image's placeholders expanded, its MMItems by offset)."""
        images = self._images(mm_data)
        self.check_count(len(images))
        pil = [load_image(im, i, self.max_image_pixels) for i, im in enumerate(images)]
        try:
            processed = self.image_processor(images=pil, return_tensors="np") if pil else {}
        except (ValueError, TypeError) as e:  # e.g. an aspect ratio the processor refuses
            raise ValueError(f"multi_modal_data['image']: the model's image processor "
                             f"cannot take the image(s): {e}") from None
        if self.image_items is not None:
            pairs = self.image_items(processed) if pil else []
        else:
            pixels = np.asarray(processed.get("pixel_values", ()), np.float32)
            pairs = [(pixels[k], self.tokens_per_image) for k in range(len(pil))]
        counts = [n for _, n in pairs]
        ids = self._expand(list(ids), counts)
        tok = self.image_token_id
        starts = [i for i, t in enumerate(ids) if t == tok and (i == 0 or ids[i - 1] != tok)]
        items = tuple(MMItem(content_hash(im), s, n, data)
                      for im, s, (data, n) in zip(pil, starts, pairs))
        return ids, items

    @staticmethod
    def _images(mm_data: Any) -> list:
        if not isinstance(mm_data, dict):
            raise ValueError(f"multi_modal_data must be a dict like {{'image': image_or_list}}, "
                             f"got {type(mm_data).__name__}")
        unknown = [k for k in mm_data if k not in SUPPORTED_MODALITIES]
        if unknown:
            raise ValueError(f"multi_modal_data: modality {unknown[0]!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_MODALITIES)})")
        images = mm_data.get("image", [])
        return list(images) if isinstance(images, (list, tuple)) else [images]

    def _expand(self, ids: list[int], counts: list[int]) -> list[int]:
        """One placeholder per image -> its ``counts[k]`` tokens; whole runs stay."""
        tok, num_images = self.image_token_id, len(counts)
        runs, i = [], 0
        while i < len(ids):
            if ids[i] == tok:
                j = i
                while j < len(ids) and ids[j] == tok:
                    j += 1
                runs.append((i, j - i))
                i = j
            else:
                i += 1
        lengths = [length for _, length in runs]
        if lengths == list(counts):
            return ids
        if lengths == [1] * num_images:
            out, k = [], 0
            for t in ids:
                if t == tok:
                    out.extend([tok] * counts[k])
                    k += 1
                else:
                    out.append(t)
            return out
        runs_of = (f"a run of {counts[0]}" if len(set(counts)) == 1 and counts
                   else f"runs of {counts}")
        raise ValueError(f"the prompt has {sum(lengths)} image placeholder token(s) (id {tok}) "
                         f"in {len(runs)} run(s) for {num_images} image(s); put one placeholder "
                         f"(or {runs_of}) where each image goes")
