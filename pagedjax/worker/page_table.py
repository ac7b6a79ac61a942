"""Page-table rows kept between steps (host side, numpy only).

A step's page table is ``[S, P]``: row i holds the physical pages of the i-th
scheduled sequence. Rebuilding it from every row's page list each step costs
O(rows x pages) Python work (128 pages per row at a 2,048-token context). Most
steps change little: a decode row gains one page every ``page_size`` tokens.

:class:`PageTables` keeps one row per live sequence in a host array (a *slot*)
and, each step, writes only what changed. It relies on the scheduler's contract
for page lists (``scheduler_output.py``): a request's list only ever grows in
place; copy-on-write, a rolled-back speculation and preemption give the request
a new list. So a row whose list is the same object with the same length as last
time is unchanged (one identity check, no compare of its pages); the same
object, longer, gained pages at its end; another object is written whole. The
step's table is then one gather ``table[slots, :P]``. The rows it returns equal
the page lists it was given, zero-padded (``tests/worker/test_runner.py`` checks it
against the row-by-row build).
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
        # sequence id -> [slot, the page list last written there, its length then]
        self._known: dict[str, list] = {}
        self._free = list(range(capacity - 1, -1, -1))

    def _assign(self, rid: str, keep: set[str]) -> list:
        if not self._free:  # drop the slots of sequences that are not in this step
            for old in [r for r in self._known if r not in keep]:
                self._free.append(self._known.pop(old)[0])
        slot = self._free.pop()
        known = self._known[rid] = [slot, None, 0]
        return known

    def slots(self, rows: Sequence, group: int = 0) -> np.ndarray:
        """Update the slots of ``rows`` (objects with ``request_id`` and ``page_ids``)
        and return their slot indices. ``group`` > 0: the rows' page lists of that KV
        group (``group_page_ids[group - 1]``; a row without them, a warm-up row,
        gives its ``page_ids``)."""
        if len(rows) > self.capacity:
            raise ValueError(f"{len(rows)} rows exceed the page-table capacity {self.capacity}")
        out: list[int] = []  # (a list, then one array: a numpy store per row costs more)
        keep: set[str] | None = None
        get = self._known.get
        for r in rows:
            pages = r.page_ids if not group or r.group_page_ids is None \
                else r.group_page_ids[group - 1]
            known = get(r.request_id)
            if known is not None and known[1] is pages and known[2] == len(pages):
                out.append(known[0])  # the common row: unchanged since the last step
                continue
            if known is None:
                if keep is None:
                    keep = {x.request_id for x in rows}
                known = self._assign(r.request_id, keep)
            slot, n = known[0], len(pages)
            if n > self.width:
                raise ValueError(f"sequence {r.request_id!r} has {n} pages, more than the "
                                 f"page-table width {self.width}")
            if known[1] is pages and n > known[2]:  # grown at the end (the only in-place edit)
                self.table[slot, known[2]:n] = pages[known[2]:]
            else:  # a new list: copy-on-write, preemption, a rollback, or a new sequence
                self.table[slot] = 0
                self.table[slot, :n] = pages
            known[1], known[2] = pages, n
            out.append(slot)
        return np.array(out, np.int64)

    def gather(self, rows: Sequence, p: int, s: int, group: int = 0) -> np.ndarray:
        """The step's page table int32[s, p] (rows past ``len(rows)`` are 0)."""
        table = np.zeros((s, p), np.int32)
        if rows:
            np.take(self.table[:, :p], self.slots(rows, group), axis=0,
                    out=table[:len(rows)])
        return table
