"""One request: token ids, progress, status and page table (host side, no JAX).

A `Request` is what the scheduler moves between its waiting queue and its
running list.  Its central number is `num_computed_tokens`: how many of
`all_token_ids` (prompt + outputs) already have their K/V written in the page
pool.  vLLM V1's rule is that every step just lets `num_computed_tokens` catch
up with `num_tokens`; a prompt chunk, a decode step and a recompute after
preemption are the same thing.

`sampling_params` is duck-typed; these attributes are read once, at
construction (missing ones take the default):

    max_tokens      int | None   None = until max_model_len; 0 = prefill only
    min_tokens      int  = 0     EOS / stop_token_ids are ignored until the
                                 request has MORE than min_tokens outputs
    stop_token_ids  list | None  finish 'stop', stop_reason = the token id
    ignore_eos      bool = False
    n               int  = 1     parallel samples (the scheduler forks)

Stop tokens stay in `output_token_ids`; the detokenizer decides what to show.
The last output token of an unfinished request is "pending": sampled but not
yet computed (`num_computed_tokens == num_tokens - 1` after an update).  An
engine that drives beam search may replace that pending token before the next
`Scheduler.schedule()`.

Placeholders (overlapped steps): `num_computed_tokens` advances when a row is
scheduled, and a row that samples adds one placeholder (`num_pending`) for the
token it will produce. The next step may be scheduled before that token is
known: its row feeds the placeholder (token id -1 in `get_token_ids`), which
the runner resolves on the device from the previous step's sampled tokens.
`Scheduler.update` turns the placeholder into the real token.

Speculative decoding (serial steps): `spec_token_ids` are proposed tokens the
next `schedule()` feeds after the last token; the step verifies them and
`Scheduler.update` keeps the accepted ones (see scheduler.py).

Fields the scheduler and the page pool keep on a request:
    block_hashes          prefix-cache hashes of full token blocks (content
                          only, so they survive preemption and forks)
    num_registered_pages  how many leading pages were offered to the cache
    num_pages_sent        leading pages of page_ids unchanged since its latest
                          row (the rest go out in the next row's new_page_ids)
    group_pages           the page tables of KV groups 1.. (hybrid models)
    group_pages_sent      per group 1..: as num_pages_sent for its table
    first_scheduled       set on first admission (num_cached_tokens is
                          recorded then, not again after a preemption)
    max_num_tokens        prompt + outputs at which it finishes with 'length'
                          (max_tokens, lowered by Scheduler.add_request to the
                          length cap)
Methods: get_token_ids(start, end), token_at(pos), append_output_token, check_stop(),
finish(status, stop_reason), fork(new_id, sample_index) (no pages).
"""

from __future__ import annotations

import enum
import sys
import time
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"  # the request failed while running (e.g. its grammar)

    def is_finished(self) -> bool:
        """`status.is_finished()` or `RequestStatus.is_finished(status)`."""
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """'stop' | 'length' | 'abort' | 'error' for finished states, else None."""
        return _FINISH_REASONS.get(self)

    @classmethod
    def from_finish_reason(cls, reason: str) -> "RequestStatus":
        for status, name in _FINISH_REASONS.items():
            if name == reason:
                return status
        raise ValueError(
            f"finish_reason must be one of 'stop', 'length', 'abort', 'error', got {reason!r}")


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


def _param(params: Any, name: str, default: Any) -> Any:
    value = getattr(params, name, default) if params is not None else default
    return default if value is None and default is not None else value


class Request:
    """A single sequence. Forked children (n > 1, beam search) are Requests too."""

    # Slotted: the scheduler reads a handful of these per row per step, and a fixed
    # layout keeps them in one object (no per-instance dict).
    __slots__ = ("request_id", "prompt_token_ids", "sampling_params", "eos_token_ids",
                 "arrival_time", "priority", "max_model_len", "cache_salt", "lora_int_id",
                 "max_tokens", "min_tokens", "stop_token_ids", "ignore_eos", "n",
                 "output_token_ids", "num_computed_tokens", "status", "page_ids",
                 "finish_reason", "stop_reason", "num_preemptions", "num_cached_tokens",
                 "parent_id", "sample_index", "block_hashes", "num_registered_pages",
                 "num_pages_sent",
                 "first_scheduled", "num_pending", "spec_token_ids", "waiting_seq",
                 "max_num_tokens", "finisher_ids", "mm_items", "prefill_only", "group_pages",
                 "group_pages_sent",
                 "mrope")

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: Any,
                 eos_token_ids: tuple[int, ...] = (), arrival_time: float | None = None,
                 priority: int = 0, max_model_len: int | None = None,
                 cache_salt: str | None = None, lora_int_id: int = 0) -> None:
        self.request_id = request_id
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.priority = priority
        self.max_model_len = max_model_len
        self.cache_salt = cache_salt
        self.lora_int_id = lora_int_id  # LoRA adapter (0: the base model)

        self.max_tokens: int | None = _param(sampling_params, "max_tokens", None)
        self.min_tokens: int = _param(sampling_params, "min_tokens", 0)
        self.stop_token_ids: frozenset[int] = frozenset(
            _param(sampling_params, "stop_token_ids", None) or ())
        self.ignore_eos: bool = bool(_param(sampling_params, "ignore_eos", False))
        self.n: int = _param(sampling_params, "n", 1)
        # max_tokens=0: prefill only (pooling): no row samples, and the request finishes
        # ('length') when its last prompt chunk's step lands.
        self.prefill_only: bool = self.max_tokens == 0
        # Tokens (prompt + outputs) at which it finishes with 'length': max_tokens here;
        # the scheduler lowers it to its length cap when the request is added.
        self.max_num_tokens: int = (len(self.prompt_token_ids) + self.max_tokens
                                    if self.max_tokens is not None else sys.maxsize)
        # The token ids that may stop it (checked per step: one set lookup first).
        self.finisher_ids = self.stop_token_ids | (
            frozenset() if self.ignore_eos else frozenset(self.eos_token_ids))

        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.page_ids: list[int] = []
        # Page tables of KV groups 1.. of a hybrid model (core/group_pages.py); group 0's
        # is page_ids.
        self.group_pages: list[list[int]] = []
        self.group_pages_sent: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        self.num_cached_tokens = 0
        self.parent_id: str | None = None
        self.sample_index = 0
        self.block_hashes: list[int] = []
        self.num_registered_pages = 0
        self.num_pages_sent = 0
        self.first_scheduled = False
        self.num_pending = 0  # sampled tokens scheduled but not yet known (placeholders)
        # Speculative decoding: tokens proposed for the next step (serial steps only),
        # scheduled after the pending token and verified by the target (spec_decode/).
        self.spec_token_ids: list[int] = []
        # Its first insertion into a priority waiting queue (the tie-break, kept when
        # a preempted request comes back).
        self.waiting_seq: int | None = None
        # Images in the prompt (core/mm_item.py MMItem, by offset); () for text.
        self.mm_items: tuple = ()
        # M-RoPE models: (the prompt's positions i32[3, prompt len], delta) or None
        # (positions past the prompt are position + delta; see models/qwen2_5_vl.py).
        self.mrope = None

    # ---- token views -------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished()

    @property
    def num_tokens_with_pending(self) -> int:
        return self.num_tokens + self.num_pending

    def get_token_ids(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole list; positions of
        placeholders (not yet known tokens) read -1."""
        p = len(self.prompt_token_ids)
        known = self.num_tokens
        pad = [-1] * max(0, end - max(start, known))
        end = min(end, known)
        if end <= p:
            return self.prompt_token_ids[start:end] + pad
        if start >= p:
            return self.output_token_ids[start - p:end - p] + pad
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p] + pad

    def token_at(self, pos: int) -> int:
        """all_token_ids[pos], or -1 for a placeholder (the decode row's fast path)."""
        p = len(self.prompt_token_ids)
        if pos < p:
            return self.prompt_token_ids[pos]
        pos -= p
        return self.output_token_ids[pos] if pos < len(self.output_token_ids) else -1

    # ---- lifecycle ---------------------------------------------------------
    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(int(token_id))

    def finish(self, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        if not status.is_finished():
            raise ValueError(f"{status} is not a finished status")
        self.status = status
        self.finish_reason = status.finish_reason
        self.stop_reason = stop_reason

    def check_stop(self) -> bool:
        """Apply the stop rules to the newest output token; finish if one fires.

        Stop tokens ('stop') win over the length limit ('length'): ``max_num_tokens``
        (max_tokens and, once a scheduler added the request, its length cap). Runs per
        row per step.
        """
        out = self.output_token_ids
        n_out = len(out)
        if n_out == 0:
            return False
        last = out[-1]
        if last in self.finisher_ids and n_out > self.min_tokens:
            if not self.ignore_eos and last in self.eos_token_ids:
                self.finish(RequestStatus.FINISHED_STOPPED)
            else:
                self.finish(RequestStatus.FINISHED_STOPPED, stop_reason=last)
            return True
        if len(self.prompt_token_ids) + n_out >= self.max_num_tokens:  # num_tokens
            self.finish(RequestStatus.FINISHED_LENGTH)
            return True
        return False

    def fork(self, new_request_id: str, sample_index: int = 0) -> "Request":
        """A copy sharing prompt and outputs so far, with no pages of its own.

        The caller (the scheduler) gives it pages (PagePool.fork) and a status.
        """
        child = Request(new_request_id, self.prompt_token_ids, self.sampling_params,
                        self.eos_token_ids, self.arrival_time, self.priority,
                        self.max_model_len, self.cache_salt, self.lora_int_id)
        child.prompt_token_ids = self.prompt_token_ids  # read-only, share it
        child.output_token_ids = list(self.output_token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.block_hashes = list(self.block_hashes)
        child.num_registered_pages = self.num_registered_pages
        child.first_scheduled = self.first_scheduled
        child.parent_id = self.request_id
        child.sample_index = sample_index
        child.max_num_tokens = self.max_num_tokens
        child.mm_items = self.mm_items
        child.mrope = self.mrope
        return child

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, "
                f"tokens={self.num_prompt_tokens}+{self.num_output_tokens}, "
                f"computed={self.num_computed_tokens}, pages={self.page_ids})")
