"""One image of a request, as the scheduler and the engine see it (host side, no JAX).

The prompt holds ``length`` placeholder tokens for the image from position
``offset``; ``content_hash`` names the image's content (the encoder cache's key and
part of the prefix-cache key); ``data`` is the model's preprocessed input for its
vision encoder (``pixel_values`` f32[C, S, S] for the SigLIP models), kept with the
request so that a preempted request can encode it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class MMItem:
    content_hash: str
    offset: int  # first placeholder position in the prompt
    length: int  # placeholder tokens (the encoder's output rows)
    data: Any  # the encoder's input (numpy)

    @property
    def end(self) -> int:
        return self.offset + self.length

    def overlaps(self, start: int, end: int) -> bool:
        """Whether positions [start, end) meet this image's placeholders."""
        return self.offset < end and start < self.end


def encoder_cut(items, start: int, num_new: int, left: int, fresh: bool) -> tuple[int, int]:
    """The scheduler's encoder budget: a chunk [start, start + num_new) encodes the
    images that begin inside it. Returns (tokens it may take, encoder rows it uses):
    it stops right before the first image that would overrun ``left`` rows, except
    that a step whose budget is untouched (``fresh``) takes one image of any size."""
    used = 0
    for it in items:
        if it.offset < start:
            continue
        if it.offset >= start + num_new:
            break
        if used + it.length > left and not (fresh and used == 0):
            return it.offset - start, used
        used += it.length
    return num_new, used
