"""What one ``Scheduler.schedule()`` hands the engine, and the contract around it.

Contract with the engine
* ScheduledRow.page_ids is the request's own page list (not a copy: copying it
  per row per step was measurable), covering the row. Read it before the next
  schedule(), which may edit it.
* Each row also says how the sequence's page list changed since the sequence's
  previous row: its first ``page_start`` pages are unchanged, and the rest of
  the list is ``new_page_ids`` (the pages gained, or after copy-on-write, a
  rolled-back speculation or preemption, the list from the first page that
  changed). A new sequence's first row (and a preempted one's next) has
  ``page_start == 0``. A worker that applies every row's change in order holds
  each sequence's page list (``worker/input_batch.py``); rows built by hand may
  leave ``new_page_ids`` None: the whole list is new.
* group_page_ids (hybrid KV layouts, core/kv_groups.py) holds the request's
  page lists of KV groups 1..; each list keeps the same contract as page_ids,
  and ``group_page_starts`` / ``group_new_page_ids`` say how each changed since
  the sequence's previous row, as ``page_start`` / ``new_page_ids`` do for
  page_ids. Entries a sliding-window group gave back are 0 (the null page);
  giving them back is a change from the first of them.
* page_copies (src, dst) have distinct dst pages, and no src is the dst of
  an EARLIER copy, so applying them in order and applying them all at once
  (`kv.at[:, dst].set(kv[:, src])`, gather before scatter) agree.  A src may
  be reused later in the list as a dst (its owner was preempted this step).
  Apply them before the step's K/V writes.
* sampled[request_id] holds `num_samples` tokens (a list; one token may also be
  a plain int) for every row with num_samples > 0 (rows with 0 may be omitted).
  Rows of requests aborted between schedule() and update() are ignored.
* update() must be called once per schedule(), in the same order; at most one
  schedule() may run ahead of its update() (one step in flight).
* Call fork_request (beam search) after update() and before the next
  schedule().  Forked requests may push the running count past max_num_seqs;
  rows per step never exceed it.
* A request with n > 1 counts as n sequences when admitted, so n must be
  <= max_num_seqs.
* The effective length cap is min(max_model_len, usable pages * page_size):
  a sequence that could never fit the pool finishes with 'length'.
* Not thread-safe: one engine thread calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(slots=True)
class ScheduledRow:
    request_id: str
    token_ids: list[int]  # new tokens fed this step
    start_pos: int        # positions are start_pos + arange(len(token_ids))
    page_ids: list[int]   # the request's page list (valid until the next schedule())
    num_samples: int = 1  # 0: mid-prompt chunk; n: fork a parallel-sampling request
    num_spec: int = 0     # proposed tokens at the end of token_ids (speculative decoding)
    page_start: int = 0   # page_ids[:page_start] unchanged since the sequence's previous row
    new_page_ids: list[int] | None = None  # page_ids[page_start:]; None: all of page_ids is new
    group_page_ids: list | None = None  # KV groups 1.. of a hybrid model: their page lists
    group_page_starts: Sequence[int] | None = None  # per group 1..: as page_start
    group_new_page_ids: Sequence | None = None  # per group 1..: as new_page_ids

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    rows: list[ScheduledRow] = field(default_factory=list)
    page_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst)
    preempted_ids: list[str] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.rows
