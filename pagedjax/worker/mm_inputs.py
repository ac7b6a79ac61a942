"""A step's image inputs: the embeddings buffer and each token's row in it.

The model step takes ``mm_embeds = (embeddings [M, H], source i32[T])``: token t of
the step reads row ``source[t]`` of the buffer instead of its token embedding
when ``source[t] >= 0``. The buffer holds the encoder output of every image that
meets one of the step's rows (from the encoder cache), padded to a power of two
rows (>= 64) so that few programs are compiled; a row that covers only part of an
image (chunked prefill cutting inside it) reads just that part.
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


def pad_source(source: np.ndarray, num_tokens: int) -> np.ndarray:
    """The per-token source padded to the step's token bucket (padding: -1)."""
    out = np.full(num_tokens, -1, np.int32)
    out[:len(source)] = source
    return out
