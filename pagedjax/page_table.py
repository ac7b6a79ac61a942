"""Page-table rows kept between steps (host side, numpy only).

A step's page table is ``[S, P]``: row i holds the physical pages of the i-th
scheduled sequence. Rebuilding it from every row's page list each step costs
O(rows x pages) Python work (128 pages per row at a 2,048-token context). Most
steps change little: a decode row gains one page every ``page_size`` tokens.

:class:`PageTables` keeps one row per live sequence in a host array (a *slot*)
and, each step, writes only what changed: the new pages at the end of a row's
list, or the whole row when its list changed in place (copy-on-write,
preemption, a rolled-back speculation). The step's table is then one gather
``table[slots, :P]``. The rows it returns equal the page lists it was given,
zero-padded (``tests/test_runner.py`` checks it against the row-by-row build).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class PageTables:
    """Slots of page-table rows; ``gather(rows, p)`` -> int32[len(rows), p]."""

    def __init__(self, width: int, capacity: int):
        self.width = width  # most pages a row can hold
        self.capacity = capacity
        self.table = np.zeros((capacity, width), np.int32)
        self._slot: dict[str, int] = {}  # sequence id -> slot
        self._known: dict[str, list[int]] = {}  # sequence id -> the pages in its slot
        self._free = list(range(capacity - 1, -1, -1))

    def _assign(self, rid: str, keep: set[str]) -> int:
        if not self._free:  # drop the slots of sequences that are not in this step
            for old in [r for r in self._slot if r not in keep]:
                self._free.append(self._slot.pop(old))
                del self._known[old]
        slot = self._free.pop()
        self._slot[rid] = slot
        self._known[rid] = []
        self.table[slot] = 0
        return slot

    def slots(self, rows: Sequence) -> np.ndarray:
        """Update the slots of ``rows`` (objects with ``request_id`` and ``page_ids``)
        and return their slot indices."""
        if len(rows) > self.capacity:
            raise ValueError(f"{len(rows)} rows exceed the page-table capacity {self.capacity}")
        out: list[int] = []  # (a list, then one array: a numpy store per row costs more)
        keep: set[str] | None = None
        for r in rows:
            rid, pages = r.request_id, r.page_ids
            slot = self._slot.get(rid)
            if slot is None:
                if keep is None:
                    keep = {x.request_id for x in rows}
                slot = self._assign(rid, keep)
            known = self._known[rid]
            if pages != known:  # lengths differ (a new page) or a page changed in place
                n = len(known)
                if len(pages) > self.width:
                    raise ValueError(f"sequence {rid!r} has {len(pages)} pages, more than the "
                                     f"page-table width {self.width}")
                if len(pages) > n and pages[:n] == known:  # grown at the end
                    self.table[slot, n:len(pages)] = pages[n:]
                else:  # copy-on-write, preemption or a rollback: rewrite the row
                    self.table[slot] = 0
                    self.table[slot, :len(pages)] = pages
                self._known[rid] = list(pages)
            out.append(slot)
        return np.array(out, np.int64)

    def gather(self, rows: Sequence, p: int, s: int) -> np.ndarray:
        """The step's page table int32[s, p] (rows past ``len(rows)`` are 0)."""
        table = np.zeros((s, p), np.int32)
        if rows:
            table[:len(rows)] = self.table[self.slots(rows), :p]
        return table
