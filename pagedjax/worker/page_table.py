"""The persistent batch's page-table column (host side, numpy only).

A step's page table is ``[S, P]``: row i holds the physical pages of the i-th
scheduled sequence. :class:`PageTable` keeps one row per live sequence of the
persistent batch (``input_batch.py``), at the same row index as the batch's
other columns, and the number of pages each holds. Each scheduled row says
how its sequence's pages changed (``ScheduledRow.page_start`` and
``new_page_ids``, ``core/scheduler_output.py``): :meth:`apply` writes just
that, so a decode row that gained no page costs nothing, and the step's table
is one gather ``table[rows, :P]``.

One object holds one page list per sequence: a model whose layers keep
different pages (KV-cache groups) holds one :class:`PageTable` per group.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class PageTable:
    """Page-table rows int32[capacity, width] and their page counts."""

    def __init__(self, width: int, capacity: int):
        self.width = width  # most pages a row can hold
        self.table = np.zeros((capacity, width), np.int32)
        self.num_pages = np.zeros(capacity, np.int64)

    @property
    def capacity(self) -> int:
        return len(self.num_pages)

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` rows (the rows held keep their index)."""
        if capacity <= self.capacity:
            return
        table = np.zeros((capacity, self.width), np.int32)
        table[:self.capacity] = self.table
        num = np.zeros(capacity, np.int64)
        num[:self.capacity] = self.num_pages
        self.table, self.num_pages = table, num

    def clear(self, row: int) -> None:
        self.table[row] = 0
        self.num_pages[row] = 0

    def move(self, src: int, dst: int) -> None:
        """Row ``src``'s pages to row ``dst`` (the batch condensing itself)."""
        self.table[dst] = self.table[src]
        self.num_pages[dst] = self.num_pages[src]

    def apply(self, row: int, start: int, new_pages: Sequence[int], seq_id: str = "") -> None:
        """Row ``row`` keeps its first ``start`` pages, then holds ``new_pages``."""
        old = int(self.num_pages[row])
        if start > old:
            raise ValueError(f"sequence {seq_id!r}: its row keeps {start} pages but holds "
                             f"only {old}; a row's page change was missed")
        n = start + len(new_pages)
        if n > self.width:
            raise ValueError(f"sequence {seq_id!r} has {n} pages, more than the page-table "
                             f"width {self.width}")
        self.table[row, start:n] = new_pages
        if n < old:
            self.table[row, n:old] = 0
        self.num_pages[row] = n

    def set_row(self, row: int, pages: Sequence[int], seq_id: str = "") -> None:
        """Row ``row`` holds ``pages`` (its whole list)."""
        self.apply(row, 0, pages, seq_id)

    def gather(self, rows: np.ndarray, p: int, s: int) -> np.ndarray:
        """The step's page table int32[s, p]: the rows ``rows``, then zeros."""
        out = np.zeros((s, p), np.int32)
        if len(rows):
            np.take(self.table[:, :p], rows, axis=0, out=out[:len(rows)])
        return out
