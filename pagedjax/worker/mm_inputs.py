"""A step's image inputs (host side): which encoder rows each of its tokens reads.

``step_pieces`` walks the step's rows; for every image that meets a row it takes
the image's encoder output from the encoder cache (encoding it there on a miss)
and notes which of the step's tokens read which of its rows. A row that covers
only part of an image (chunked prefill cutting inside it) reads just that part.
The runner then gathers the pieces into the step's image buffer (one small
program per token bucket and encoder output size: ``worker/mm_programs.py``), so
the model step takes ``mm_embeds = (rows [T, H], source i32[T])`` at a shape fixed
by its bucket: one program per bucket, whatever the images.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pagedjax.worker.encoder_cache import EncoderCache


def step_pieces(rows: Sequence, items_of: Callable[[str], tuple],
                cache: EncoderCache) -> list[tuple]:
    """[(encoder rows [R, H] device array, step token indices i64[k], their rows
    i32[k])] for every image meeting the step's rows; ``items_of(request_id)``: the
    request's MMItems."""
    pieces, off = [], 0
    for row in rows:
        n = len(row.token_ids)
        a, b = row.start_pos, row.start_pos + n
        for it in items_of(row.request_id):
            if not it.overlaps(a, b):
                continue
            lo, hi = max(a, it.offset), min(b, it.end)
            pieces.append((cache.get(it, row.request_id), off + np.arange(lo - a, hi - a),
                           (lo - it.offset + np.arange(hi - lo)).astype(np.int32)))
        off += n
    return pieces
