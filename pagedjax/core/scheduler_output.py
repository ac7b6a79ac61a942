"""What one ``Scheduler.schedule()`` hands the engine, and the contract around it.

Contract with the engine
* ScheduledRow.page_ids is the request's own page list (not a copy: copying it
  per row per step was measurable), covering the row. Read it before the next
  schedule(), which may extend it. A list only ever grows in place: anything
  else (copy-on-write, a rolled-back speculation, preemption, a fork) gives the
  request a new list, so a reader that kept a list and its length knows it is
  unchanged when both match (``page_table.PageTables`` relies on this).
* group_page_ids (hybrid KV layouts, core/kv_groups.py) holds the request's
  page lists of KV groups 1..; each keeps the same contract as page_ids.
  Entries a sliding-window group gave back are 0 (the null page).
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


@dataclass(slots=True)
class ScheduledRow:
    request_id: str
    token_ids: list[int]  # new tokens fed this step
    start_pos: int        # positions are start_pos + arange(len(token_ids))
    page_ids: list[int]   # the request's page list (valid until the next schedule())
    num_samples: int = 1  # 0: mid-prompt chunk; n: fork a parallel-sampling request
    num_spec: int = 0     # proposed tokens at the end of token_ids (speculative decoding)
    group_page_ids: list | None = None  # KV groups 1.. of a hybrid model: their page lists

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
