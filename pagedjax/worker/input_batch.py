"""The persistent batch: the live sequences' per-row state, as numpy columns (host side).

One row per live sequence (a request's sample, an n > 1 child, a beam), at an
index that only moves when another row leaves: :meth:`InputBatch.add` appends a
row, :meth:`InputBatch.remove` moves the last row into the hole (the rows stay
dense, ``0 .. len - 1``). Every column is indexed by that row:

* the page table (``page_table.PageTable``), changed only by what each
  scheduled row says it gained (:meth:`apply_page_changes`); under hybrid KV
  groups (``core/kv_groups.py``) one table per group, each changed by that
  group's page changes (a sliding-window group's pages given back become the
  null page 0 in its table);
* the sampling parameters fixed for the sequence: greedy, temperature, top-k,
  top-p, min-p and the seed's key words, one record per row (``STATIC_DTYPE``:
  a step takes its rows' records in one gather); whether the row needs its full
  state each step (penalties, bans, bias, allowed ids, bad words, a grammar),
  its logprobs count; the LoRA adapter id; the prompt length;
* ``sample_pos``: the row's first sampling row in the latest launched step,
  where the next step's placeholder reads its token on the device;
* by reference: the sequence's prompt and output token lists (the scheduler's
  own, read for the few rows that need their history), and its request's
  sampling record (``params`` per sample index, ``fallback(index)``,
  ``bad_words_ids``: ``engine/sequences.py``'s ``RequestSampling``).

A step gathers its rows' columns (one ``np.take`` each): no per-row Python for
the common row, and nothing to decide whether a kept value is stale. Forks
(n > 1 children, beams) are added like any sequence; a speculative rollback or
a preemption reaches the page table as a row's page change.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Sequence

import numpy as np

from pagedjax.sample.metadata import (RowState, SamplingColumns, SamplingTensors, static_row,
                                      static_columns, tensors_from_columns)
from pagedjax.worker.inputs import SampleRow, row_range, sampling_rows_padded
from pagedjax.worker.page_table import PageTable

_num_samples = operator.attrgetter("num_samples")
_num_spec = operator.attrgetter("num_spec")
_new_page_ids = operator.attrgetter("new_page_ids")
_page_start = operator.attrgetter("page_start")

# A sequence's logprobs column when it wants none.
NO_LOGPROBS = -1
# A sequence's top_k column when top-k is off (any k >= the vocabulary keeps every token).
NO_TOP_K = np.iinfo(np.int32).max
# The sampling parameters fixed for a sequence, one record per row (a step gathers them
# in one take): the fields of ``SamplingColumns``.
STATIC_DTYPE = np.dtype([("greedy", bool), ("temperature", np.float32), ("top_k", np.int32),
                         ("top_p", np.float32), ("min_p", np.float32),
                         ("key_data", np.uint32, (2,))], align=True)
_FIRST_CAPACITY = 64


class InputBatch:
    """The live sequences' columns (see the module docstring)."""

    def __init__(self, page_width: int, capacity: int = _FIRST_CAPACITY,
                 eos_token_ids: Sequence[int] = (), num_groups: int = 1):
        self.eos_token_ids = tuple(eos_token_ids)
        self.index: dict[str, int] = {}  # sequence id -> its row
        self.seq_ids: list[str] = []
        self.request_ids: list[str] = []
        self.sampling: list[Any] = []
        self.prompts: list[Sequence[int]] = []
        self.outputs: list[Sequence[int]] = []
        # One page table per KV group; group 0's is ``page_table``.
        self.page_tables = [PageTable(page_width, capacity) for _ in range(num_groups)]
        self.page_table = self.page_tables[0]
        # Rows needing their full state each step (``special``): 0 spares the check.
        self.num_special = 0
        self._columns: dict[str, np.ndarray] = {"static": np.zeros(capacity, STATIC_DTYPE)}
        for name, dtype in (("sample_index", np.int64), ("num_prompt", np.int64),
                            ("special", bool), ("grammar", bool), ("num_logprobs", np.int32),
                            ("lora_id", np.int32), ("sample_pos", np.int32)):
            self._columns[name] = np.zeros(capacity, dtype)

    def __getattr__(self, name: str) -> np.ndarray:
        columns = self.__dict__["_columns"]
        if name in columns:
            return columns[name]
        if name in STATIC_DTYPE.names:  # a field of the static sampling columns (a view)
            return columns["static"][name]
        raise AttributeError(name)

    def __len__(self) -> int:
        return len(self.seq_ids)

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self.index

    # ------------------------------------------------------------------ rows in and out
    def add(self, seq_id: str, request_id: str, index: int, sampling: Any,
            prompt_token_ids: Sequence[int], output_token_ids: Sequence[int],
            lora_id: int = 0, grammar: bool = False) -> int:
        """A new row for sequence ``seq_id``, sample ``index`` of ``request_id``; returns it."""
        if seq_id in self.index:
            raise ValueError(f"sequence {seq_id!r} already has a row")
        row = len(self.seq_ids)
        if row == self.page_table.capacity:
            self._grow(2 * row)
        self.index[seq_id] = row
        self.seq_ids.append(seq_id)
        self.request_ids.append(request_id)
        self.sampling.append(sampling)
        self.prompts.append(prompt_token_ids)
        self.outputs.append(output_token_ids)
        params = sampling.params[index]
        st = static_row(params, sampling.fallback(index))
        c = self._columns
        c["sample_index"][row] = index
        c["num_prompt"][row] = len(prompt_token_ids)
        c["static"][row] = (st.greedy, st.temperature, st.top_k or NO_TOP_K, st.top_p,
                            st.min_p, (st.seed_hi, st.seed_lo))
        special = st.extras or bool(sampling.bad_words_ids) or grammar
        c["special"][row] = special
        self.num_special += special
        c["grammar"][row] = grammar
        c["num_logprobs"][row] = NO_LOGPROBS if params.logprobs is None else params.logprobs
        c["lora_id"][row] = lora_id
        c["sample_pos"][row] = -1
        for table in self.page_tables:
            table.clear(row)
        return row

    def remove(self, seq_id: str) -> None:
        """Drop a sequence's row (no-op if it has none); the last row takes its place."""
        row = self.index.pop(seq_id, None)
        if row is None:
            return
        self.num_special -= bool(self._columns["special"][row])
        last = len(self.seq_ids) - 1
        if row != last:
            moved = self.seq_ids[last]
            self.index[moved] = row
            for lst in (self.seq_ids, self.request_ids, self.sampling, self.prompts,
                        self.outputs):
                lst[row] = lst[last]
            for col in self._columns.values():
                col[row] = col[last]
            for table in self.page_tables:
                table.move(last, row)
        for lst in (self.seq_ids, self.request_ids, self.sampling, self.prompts, self.outputs):
            lst.pop()

    def _grow(self, capacity: int) -> None:
        for name, col in self._columns.items():
            new = np.zeros((capacity,) + col.shape[1:], col.dtype)
            new[:len(col)] = col
            self._columns[name] = new
        for table in self.page_tables:
            table.grow(capacity)

    def request_of(self, seq_id: str) -> tuple[str, int] | None:
        """(request id, sample index) of a live sequence, else None."""
        row = self.index.get(seq_id)
        if row is None:
            return None
        return self.request_ids[row], int(self._columns["sample_index"][row])

    def prompt_of(self, seq_id: str) -> Sequence[int]:
        """A live sequence's prompt token ids."""
        return self.prompts[self.index[seq_id]]

    def rows_of(self, seq_ids: Sequence[str]) -> np.ndarray:
        """The rows of ``seq_ids`` (each must have one), int64."""
        return np.fromiter(map(self.index.__getitem__, seq_ids), np.int64, len(seq_ids))

    # ------------------------------------------------------------------ per step
    def apply_page_changes(self, rows: Sequence, idx: np.ndarray) -> None:
        """Apply each scheduled row's page change (``ScheduledRow.page_start`` and
        ``new_page_ids``; None: the row's whole ``page_ids``) to its sequence's row
        ``idx[i]``, and under hybrid KV groups each group's (``group_page_starts``
        and ``group_new_page_ids``). Rows whose pages did not change cost one
        comparison each."""
        table, n = self.page_table, len(rows)
        news = list(map(_new_page_ids, rows))
        # The rows that gained pages or lost some (C-level passes over the rows).
        lost = np.fromiter(map(_page_start, rows), np.int64, n) != table.num_pages[idx]
        changed = np.flatnonzero(lost | np.fromiter(map(bool, news), bool, n) if any(news)
                                 else lost)
        for i in changed.tolist():
            r = rows[i]
            if news[i] is not None:
                table.apply(int(idx[i]), r.page_start, news[i], r.request_id)
        if None in news:  # rows built by hand: their whole list
            for i, new in enumerate(news):
                if new is None:
                    table.set_row(int(idx[i]), rows[i].page_ids, rows[i].request_id)
        if len(self.page_tables) > 1:
            self._apply_group_changes(rows, idx)

    def _apply_group_changes(self, rows: Sequence, idx: np.ndarray) -> None:
        """KV groups 1..: each row's change of each group's page list (rows without
        them, built by hand, give their whole lists: ``group_page_ids``, else
        ``page_ids``)."""
        for i, r in enumerate(rows):
            row = int(idx[i])
            lists = getattr(r, "group_page_ids", None)
            starts = getattr(r, "group_page_starts", None)
            news = getattr(r, "group_new_page_ids", None)
            for g, table in enumerate(self.page_tables[1:]):
                if news is not None and news[g] is not None:
                    if news[g] or starts[g] != table.num_pages[row]:
                        table.apply(row, starts[g], news[g], r.request_id)
                else:
                    table.set_row(row, r.page_ids if lists is None else lists[g],
                                  r.request_id)

    def sampling_layout(self, rows, idx: np.ndarray, kv_lens: np.ndarray, s: int,
                        forks: Sequence[tuple[int, int]]):
        """Where a step's sampling rows come from, for scheduled ``rows`` (batch rows
        ``idx``, ``kv_lens``: each row's end, S: the step's row bucket): (the batch
        rows of the step rows that sample, their seed counters padded to R, the fork
        rows (batch row, sample index), sample_index i32[R])."""
        n = len(rows)
        nsamp = list(map(_num_samples, rows))
        nspec = list(map(_num_spec, rows))
        if nsamp.count(1) == n and not any(nspec):  # each row samples once, no proposals
            order = row_range(n)
            first, ends = idx, kv_lens[:n]
        else:
            order = np.flatnonzero(np.array(nsamp, np.int64))
            first = idx[order]
            ends = kv_lens[order] - np.array(nspec, np.int64)[order]  # less the proposals
        n1 = len(first)
        r_pad = sampling_rows_padded(n1 + len(forks), s)
        # Tokens before the sampled one: the row's end, less its proposals and the prompt.
        counter = np.zeros(r_pad, np.int32)
        counter[:n1] = ends - self._columns["num_prompt"][first]
        sample_index = np.zeros(r_pad, np.int32)
        sample_index[:n1] = order
        sample_index[n1:n1 + len(forks)] = [i for i, _ in forks]
        fork_rows = [(int(idx[i]), j) for i, j in forks]
        return first, counter, fork_rows, sample_index

    def sample_rows(self, rows, forks: Sequence[tuple[int, int]] = (),
                    grammar_bits: dict[int, Any] | None = None) -> list[SampleRow]:
        """A step's sampling rows with explicit states (speculative decoding verifies
        with them): each sampling row's first
        sample, then ``forks`` ((row index, sample index) of n > 1 prompts' other
        samples)."""
        ib, bits = self, grammar_bits or {}
        out = []
        for i, r in enumerate(rows):
            if not r.num_samples:
                continue
            b = ib.index[r.request_id]
            num = r.start_pos + len(r.token_ids) - r.num_spec - int(self._columns["num_prompt"][b])
            out.append(SampleRow(r.request_id, i, ib.row_state(b, num, bits.get(len(out))),
                                 ib.most_logprobs(np.array([b]))))
        for i, j in forks:
            b = ib.index[rows[i].request_id]
            out.append(SampleRow(rows[i].request_id, i,
                                 ib.row_state(b, 0, bits.get(len(out)), index=j, fork=True),
                                 ib.most_logprobs(np.array([b]))))
        return out

    def row_state(self, row: int, num_outputs: int, grammar_bits: Any = None,
                  index: int | None = None, fork: bool = False) -> RowState:
        """Row ``row``'s full sampling state with ``num_outputs`` tokens before the one
        sampled (``index``: another sample of its request, for an n > 1 fork)."""
        s = self.sampling[row]
        if index is None:
            index = int(self._columns["sample_index"][row])
        outputs = () if fork else self.outputs[row]
        return RowState(s.params[index], self.prompts[row], outputs, s.fallback(index),
                        self.eos_token_ids, s.bad_words_ids, num_outputs - len(outputs),
                        grammar_bits)

    def sampling_tensors(self, first: np.ndarray, counter: np.ndarray,
                         forks: Sequence[tuple[int, int]], grammar_bits: dict[int, Any],
                         num_rows_padded: int, vocab_size: int, history_len: int
                         ) -> SamplingTensors:
        """A step's sampling tensors (see :meth:`step_sampling`)."""
        return self.step_sampling(first, counter, forks, grammar_bits, num_rows_padded,
                                  vocab_size, history_len).tensors()

    def step_sampling(self, first: np.ndarray, counter: np.ndarray,
                      forks: Sequence[tuple[int, int]], grammar_bits: dict[int, Any],
                      num_rows_padded: int, vocab_size: int, history_len: int
                      ) -> "StepSampling":
        """A step's sampling rows, read from the batch now (rows may move later):
        sampling row j < len(first) is row ``first[j]`` (with ``counter[j]`` tokens
        before the one it samples), then one row per ``forks`` entry (batch row,
        sample index) at the start of its outputs; ``grammar_bits``: sampling row ->
        its grammar mask."""
        R, V = num_rows_padded, vocab_size
        n1, n = len(first), len(first) + len(forks)
        if n > R:
            raise ValueError(f"got {n} sampling rows for num_rows_padded={R}")
        c = self._columns
        static = _padding(R).copy()
        np.take(c["static"], first, out=static[:n1])
        top_k = static["top_k"]
        np.minimum(top_k, V, out=top_k)
        cols = SamplingColumns(static["greedy"], static["temperature"], top_k, static["top_p"],
                               static["min_p"], static["key_data"])
        special: dict[int, RowState] = {}
        if self.num_special:
            for j in np.flatnonzero(c["special"][first]).tolist():
                special[j] = self.row_state(int(first[j]), int(counter[j]),
                                            grammar_bits.get(j))
        if forks:
            states = [self.row_state(row, 0, grammar_bits.get(j), index=i, fork=True)
                      for j, (row, i) in enumerate(forks, n1)]
            fc = static_columns([static_row(st.params, st.fallback_seed) for st in states],
                                len(states), V)
            for dst, src in zip(cols, fc):
                dst[n1:n] = src
            for j, (st, (row, _)) in enumerate(zip(states, forks), n1):
                if c["special"][row]:
                    special[j] = st
        return StepSampling(cols, n, counter, special, V, history_len)

    def most_logprobs(self, rows: np.ndarray) -> int | None:
        """The most logprobs any of ``rows`` wants, None when none wants them."""
        if not len(rows):
            return None
        most = int(self._columns["num_logprobs"][rows].max())
        return None if most == NO_LOGPROBS else most


@functools.lru_cache(maxsize=32)
def _padding(num_rows: int) -> np.ndarray:
    """``num_rows`` static records of greedy padding rows (read-only: copy it)."""
    rows = np.zeros(num_rows, STATIC_DTYPE)
    rows["greedy"], rows["temperature"], rows["top_k"], rows["top_p"] = True, 1.0, NO_TOP_K, 1.0
    rows.flags.writeable = False
    return rows


@dataclasses.dataclass
class StepSampling:
    """One step's sampling rows, taken from the batch at launch: their static
    columns, seed counters and the full state of the rows that need it."""

    columns: SamplingColumns
    num_rows: int
    counter: np.ndarray
    special: dict[int, RowState]
    vocab_size: int
    history_len: int

    def tensors(self, grammar_bits: dict[int, Any] | None = None) -> SamplingTensors:
        """The SamplingTensors; ``grammar_bits`` (sampling row -> mask) replace the
        grammar masks the rows were taken with."""
        special = self.special
        if grammar_bits:
            special = {j: dataclasses.replace(st, grammar_bits=grammar_bits[j])
                       if j in grammar_bits else st for j, st in special.items()}
        return tensors_from_columns(self.columns, self.num_rows, self.counter, special,
                                    self.vocab_size, self.history_len)
