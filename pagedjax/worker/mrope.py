"""A step's M-RoPE positions (host side, numpy): three rotary position rows per token
for the models whose rotary is multimodal (``models/qwen2_5_vl.py``).

A request's prompt table and delta are computed once when it is added
(``Request.mrope``: the model's ``mrope_positions``); a token at sequence position
``p`` takes column ``p`` of the table inside the prompt and ``p + delta`` in all three
rows after it (generated tokens). Rows of requests without images (no table) keep
their plain positions in all three rows.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def step_positions(rows: Sequence, positions: np.ndarray, offsets: np.ndarray,
                   mrope_of: Callable) -> np.ndarray:
    """i32[3, T] for a step whose token i of row r sits at ``positions[offsets[r] + i]``
    (padding keeps its plain position); ``mrope_of(request_id)``: (table, delta) or None."""
    out = np.broadcast_to(positions, (3,) + positions.shape).copy()
    for i, r in enumerate(rows):
        m = mrope_of(r.request_id)
        if m is None:
            continue
        table, delta = m
        a = int(offsets[i])
        view = out[:, a:a + len(r.token_ids)]
        p = positions[a:a + len(r.token_ids)]
        view[:] = p + delta
        inside = p < table.shape[1]
        if inside.any():
            view[:, inside] = table[:, p[inside]]
    return out
