"""Images in ``LLM.chat`` messages: content parts -> template text + the images.

Parts: ``{"type": "text", "text": ...}``, ``{"type": "image_pil", "image_pil": PIL image}``,
``{"type": "image", "image": PIL image | array | bytes}`` and ``{"type": "image_url",
"image_url": {"url": "data:image/...;base64,..."}}`` (the server, not ``LLM.chat``,
fetches http(s) URLs, under its media limits). Each image becomes the model's
placeholder text where it stood (``MultiModalProcessor.placeholder_text``); the text
parts are joined.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Optional

IMAGE_PART_TYPES = ("image", "image_pil", "image_url")


def _image_of(part: dict) -> Any:
    kind = part["type"]
    if kind != "image_url":
        return part.get(kind)
    iu = part.get("image_url")
    url = iu.get("url") if isinstance(iu, dict) else iu
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise ValueError("messages: LLM.chat takes image_url parts as base64 data: URLs; "
                         "pass other images as image_pil parts (PIL images)")
    try:
        return base64.b64decode(url.split(",", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("messages: an image_url data: URL is not valid base64") from None


def chat_images(messages: list[dict], placeholder: Optional[str]) -> tuple[list[dict], list]:
    """(messages whose content is text, the images in order). ``placeholder`` None: the
    model is text-only (ValueError on any image part)."""
    out, images = [], []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        text = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in IMAGE_PART_TYPES:
                if placeholder is None:
                    raise ValueError("messages: this model is text-only and takes no images")
                images.append(_image_of(part))
                text.append(placeholder)
            elif kind == "text":
                text.append(str(part.get("text", "")))
            else:
                raise ValueError(f"messages: content part type {kind!r} is not supported "
                                 f"(text, {', '.join(IMAGE_PART_TYPES)})")
        out.append({**m, "content": "".join(text)})
    return out, images
