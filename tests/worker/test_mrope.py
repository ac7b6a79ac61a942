"""A step's M-RoPE rows (worker/mrope.py) from each request's prompt table: prompt
chunks read their columns, generated tokens take position + delta, rows without a
table and the padding keep their plain positions."""

from __future__ import annotations

import numpy as np

from pagedjax.core.scheduler_output import ScheduledRow
from pagedjax.worker.mrope import step_positions


def test_chunk_decode_and_text_rows():
    table = np.array([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]],
                     np.int32)  # 2 text tokens, a 2 x 2 image, one text token: delta -2
    known = {"img": (table, -2), "gen": (table, -2)}
    rows = [ScheduledRow("img", [0, 0, 0], 3, []),   # a chunk inside the image
            ScheduledRow("gen", [0], 9, []),          # decoding after the prompt
            ScheduledRow("txt", [0, 0], 4, [])]       # a text-only request
    positions = np.array([3, 4, 5, 9, 4, 5, 0, 0], np.int32)  # two padding tokens
    out = step_positions(rows, positions, np.array([0, 3, 4]), known.get)
    assert out.dtype == np.int32 and out.shape == (3, 8)
    np.testing.assert_array_equal(out[:, :3], table[:, 3:6])
    np.testing.assert_array_equal(out[:, 3], [7, 7, 7])
    np.testing.assert_array_equal(out[:, 4:], np.broadcast_to([4, 5, 0, 0], (3, 4)))
