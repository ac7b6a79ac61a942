"""A step's image inputs: the embeddings buffer and each token's row in it.

``step_mm_inputs`` concatenates the encoder output of every image that meets one of
the step's rows (from the encoder cache), padded to a power of two rows (>= 64), and
gives each token its row there (-1: a text token); a row that covers only part of an
image (chunked prefill cutting inside it) reads just that part. ``step_rows`` then
gathers the rows the step reads into a buffer of the step's token bucket T (a small
program of its own), so the model step takes ``mm_embeds = (embeddings [T, H],
source i32[T])`` at a shape fixed by its bucket: one program per bucket with images,
whatever the images.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from pagedjax.worker.encoder_cache import EncoderCache
from pagedjax.worker.inputs import pow2


def step_mm_inputs(rows: Sequence, items_of: Callable[[str], tuple],
                   cache: EncoderCache) -> tuple | None:
    """(embeddings [M, H] device array, source i32[num tokens]) or None (no image
    tokens in the step). ``items_of(request_id)``: the request's MMItems."""
    pieces, base, off = [], 0, 0
    source = None
    for row in rows:
        n = len(row.token_ids)
        a, b = row.start_pos, row.start_pos + n
        for it in items_of(row.request_id):
            if not it.overlaps(a, b):
                continue
            if source is None:
                source = np.full(sum(len(r.token_ids) for r in rows), -1, np.int32)
            pieces.append(cache.get(it, row.request_id))
            lo, hi = max(a, it.offset), min(b, it.end)
            source[off + lo - a:off + hi - a] = base + (lo - it.offset) + np.arange(hi - lo)
            base += it.length
        off += n
    if source is None:
        return None
    m = pow2(base, 64)
    if m > base:
        pieces.append(jnp.zeros((m - base, pieces[0].shape[1]), pieces[0].dtype))
    return jnp.concatenate(pieces), source


def step_rows(gather: Callable, mm: tuple, num_tokens: int) -> tuple:
    """(all images' rows [M, H], source over the real tokens) -> (the rows the step
    reads [num_tokens, H], source i32[num_tokens] into them); ``gather(buf, rows)``."""
    buf, source = mm
    rows = np.zeros(num_tokens, np.int32)
    rows[:len(source)] = np.maximum(source, 0)
    src = np.full(num_tokens, -1, np.int32)
    src[:len(source)] = np.where(source >= 0, np.arange(len(source)), -1)
    return gather(buf, rows), src
