"""Token-budget scheduler (vLLM V1 rule), host side, no JAX.

There are no prefill/decode phases: every request has `num_computed_tokens`
catching up with `num_tokens`.  One `schedule()`:

1. Running requests, oldest first, each get their pending tokens (normally 1;
   the rest of a prompt when it was chunked), capped by the token budget.
   Pages are allocated to cover start_pos + num_new; a shared page about to be
   written is copied first (copy-on-write, emitted in `page_copies`).  When the
   pool runs dry the newest running request (policy "priority": the lowest
   priority, i.e. the largest `priority` value, then the latest arrival) is
   preempted: pages freed, `num_computed_tokens = 0`, status PREEMPTED, put at
   the front of the waiting queue to recompute prompt + outputs later.  If the
   victim is the request being scheduled it simply waits.
2. If nobody was preempted, waiting requests (FCFS, or by (priority, arrival)
   under policy "priority") are admitted while the budget, `max_num_seqs` and
   the pool allow; prefix-cache hits move `num_computed_tokens` ahead on
   admission.  With chunked prefill off a request is admitted only when its
   whole remaining prompt fits the budget.

`schedule()` advances each row's `num_computed_tokens` at once and gives every
row that samples a placeholder for its token (`Request.num_pending`), so the
next step can be scheduled before this one's tokens are known (overlapped
steps). A request whose placeholders already reach a length limit is not
scheduled again; a preempted request with a placeholder waits for it.

`update(output, sampled)` (below) then applies the step's
tokens: prefix-cache registration, n > 1 forks, stop rules, freeing pages. A
prefill-only request (``max_tokens=0``, pooling) never samples: its rows carry
no placeholder and it finishes ('length') when its last prompt row lands.
Finished requests leave the scheduler (`get_request` returns None afterwards);
`update`, `abort_request` and `finish_request` hand them back to the engine.
The rows, copies and the contract with the engine: ``scheduler_output.py``.

Hybrid KV layouts (``kv_layout`` with several groups or a sliding window,
``kv_groups.py``): a request has one page table per group and the page work
(reserve, slide, prefix hits, forks, rollback, freeing) goes to
``group_pages.GroupPages``; ``kv_waste`` looks at group 0.

Extras: `stats()` (PoolStats), `kv_capacity()`, `kv_waste()`, `num_running`, `num_waiting`
(properties), `get_num_unfinished_requests()`, `pool` (the PagePool).
"""

from __future__ import annotations

from pagedjax.core.group_pages import GroupPages
from pagedjax.core.kv_groups import KVLayout
from pagedjax.core.mm_item import encoder_cut
from pagedjax.core.page_pool import PagePool, PoolStats
from pagedjax.core.request import Request, RequestStatus
from pagedjax.core.scheduler_output import ScheduledRow, SchedulerOutput
from pagedjax.core.waiting_queue import WaitingQueue
from pagedjax.utils import cdiv

# A row's new_page_ids when its sequence's page list did not change.
NO_NEW_PAGES: tuple = ()

__all__ = ["ScheduledRow", "Scheduler", "SchedulerOutput"]


class Scheduler:
    """Token-budget scheduling (``schedule``) and result updates (``update``: prefix-cache
    registration, n > 1 forks, speculative rollback, stop rules, freeing pages) over one
    page pool."""

    def __init__(self, num_pages: int, page_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 enable_prefix_caching: bool = False, policy: str = "fcfs",
                 enable_chunked_prefill: bool = True, admit=None,
                 encoder_budget: int | None = None, kv_layout: KVLayout | None = None) -> None:
        for name, value in (("page_size", page_size), ("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens),
                            ("max_model_len", max_model_len)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {policy!r}")
        if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({max_num_batched_tokens}) "
                f"must be >= max_model_len ({max_model_len}); raise it, lower max_model_len "
                f"or enable chunked prefill")
        self.pool = PagePool(num_pages, page_size, enable_prefix_caching)
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = policy
        # Optional admission check admit(request, running) -> bool, asked right before
        # a waiting request is admitted (LoRA: its adapter needs a device slot); False
        # keeps it (and those behind it) waiting.
        self.admit = admit
        # Vision-encoder rows one step may start (images beginning in its chunks;
        # core/mm_item.py encoder_cut); None: text-only, no limit.
        self.encoder_budget = encoder_budget
        self._encoder_left = 0
        self.max_seq_len = min(max_model_len, self.pool.num_usable_pages * page_size)
        # Hybrid KV layouts (several groups, or a sliding window): the group allocator
        # does the page work (core/group_pages.py); None: one full-attention table.
        self.groups = GroupPages(self.pool, kv_layout, max_num_batched_tokens) \
            if kv_layout is not None and kv_layout.grouped else None
        if self.groups is not None:
            self.max_seq_len = kv_layout.max_tokens_for(
                self.pool.num_usable_pages, page_size, max_num_batched_tokens, max_model_len)
        self.requests: dict[str, Request] = {}
        self.waiting = WaitingQueue(policy == "priority")
        self.running: list[Request] = []
        self.num_preemptions = 0  # preemptions since start (vllm:num_preemptions)

    # ---- requests in and out -----------------------------------------------
    def add_request(self, req: Request) -> None:
        rid, n = req.request_id, req.num_prompt_tokens
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        if n == 0:
            raise ValueError(f"request {rid!r}: the prompt is empty; give at least one token")
        if n > self.max_model_len:
            raise ValueError(f"request {rid!r}: the prompt has {n} tokens, more than "
                             f"max_model_len={self.max_model_len}; shorten the prompt or "
                             f"raise max_model_len")
        need, usable = cdiv(n, self.page_size), self.pool.num_usable_pages
        if self.groups is not None:
            need = self.groups.pages_per_seq(n)
        if need > usable:
            raise ValueError(f"request {rid!r}: the prompt needs {need} KV pages of "
                             f"{self.page_size} tokens but the pool has only {usable} usable "
                             f"pages (num_pages={self.pool.num_pages}, page 0 is reserved); "
                             f"raise num_pages (or the KV memory budget) or shorten the prompt")
        if req.n < 1 or req.n > self.max_num_seqs:
            raise ValueError(f"request {rid!r}: n={req.n} must be between 1 and "
                             f"max_num_seqs={self.max_num_seqs}; lower n or raise max_num_seqs")
        if req.max_tokens is not None and req.max_tokens < (0 if req.n == 1 else 1):
            raise ValueError(f"request {rid!r}: max_tokens must be >= 1 (0: prefill only, "
                             f"with n=1), got {req.max_tokens}")
        req.max_model_len = min(req.max_model_len or self.max_model_len, self.max_model_len)
        req.max_num_tokens = min(req.max_num_tokens, req.max_model_len, self.max_seq_len)
        req.status = RequestStatus.WAITING
        self.requests[rid] = req
        self.waiting.push(req)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def abort_request(self, request_id: str) -> Request | None:
        return self.finish_request(request_id, "abort")

    def finish_request(self, request_id: str, finish_reason: str,
                       stop_reason: int | str | None = None) -> Request | None:
        """Finish a live request now ('stop' | 'length' | 'abort'); None if unknown."""
        status = RequestStatus.from_finish_reason(finish_reason)
        req = self.requests.get(request_id)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.finish(status, stop_reason)
        self._release(req)
        return req

    def fork_request(self, request_id: str, new_request_id: str) -> Request:
        """A new request sharing the parent's tokens and pages (beam search)."""
        parent = self.requests.get(request_id)
        if parent is None:
            raise ValueError(f"cannot fork unknown or finished request {request_id!r}")
        if new_request_id in self.requests:
            raise ValueError(f"request id {new_request_id!r} is already in use")
        child = parent.fork(new_request_id, sample_index=parent.sample_index)
        self.requests[new_request_id] = child
        if parent.status == RequestStatus.RUNNING:
            if self.groups is not None:
                self.groups.fork(parent, child)
            else:
                child.page_ids = self.pool.fork(parent.page_ids)
            child.status = RequestStatus.RUNNING
            self.running.append(child)
        else:
            child.status = parent.status
            self.waiting.push(child)
        return child

    def _release(self, req: Request) -> None:
        self._free_pages(req)
        self.requests.pop(req.request_id, None)

    def _free_pages(self, req: Request) -> None:
        if self.groups is not None:
            self.groups.free(req)
            return
        self.pool.free(req.page_ids)
        req.page_ids = []
        req.num_pages_sent = 0

    # ---- schedule ----------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        rows: dict[str, ScheduledRow] = {}
        copies: dict[str, list[tuple[int, int]]] = {}
        out = SchedulerOutput()
        self._encoder_left = self.encoder_budget or 0
        budget = self._schedule_running(rows, copies, out.preempted_ids)
        if not out.preempted_ids:
            budget = self._schedule_waiting(rows, budget)
        out.rows = list(rows.values())
        if copies:
            out.page_copies = [c for rid in rows for c in copies.get(rid, ())]
        out.num_batched_tokens = self.max_num_batched_tokens - budget  # the rows' tokens
        return out

    def _schedule_running(self, rows, copies, preempted) -> int:
        budget = self.max_num_batched_tokens
        running, max_rows, ps = self.running, self.max_num_seqs, self.page_size
        refs = self.pool.ref_counts
        groups = self.groups
        i = 0
        while i < len(running) and budget > 0 and len(rows) < max_rows:
            req = running[i]
            prompt, outs, pending = req.prompt_token_ids, req.output_token_ids, req.num_pending
            with_pending = len(prompt) + len(outs) + pending  # num_tokens_with_pending
            start = req.num_computed_tokens
            # A request whose placeholders already reach the length cap or max_tokens
            # finishes when they land: it gets no more rows.
            if pending and with_pending >= req.max_num_tokens:
                i += 1
                continue
            spec = req.spec_token_ids
            if with_pending - start == 1 and not spec and req.n == 1 and not req.prefill_only:
                table = req.page_ids
                j = start // ps
                sent = req.num_pages_sent
                if j < len(table) and refs[table[j]] <= 1 and sent == len(table) and (
                        groups is None or groups.decode_ready(req, j)):
                    # The common decode row: its last token (a placeholder while one is
                    # in flight) into a page of its own, nothing from the pool, its page
                    # list unchanged (this loop runs per row per step: _reserve's first
                    # case, _make_row and Request.token_at are inlined here for it).
                    token = [-1 if pending else outs[-1] if outs else prompt[-1]]
                    if groups is None:
                        row = ScheduledRow(req.request_id, token, start, table, 1, 0, sent,
                                           NO_NEW_PAGES)
                    else:
                        row = ScheduledRow(req.request_id, token, start, table, 1, 0, sent,
                                           NO_NEW_PAGES, req.group_pages,
                                           tuple(req.group_pages_sent),
                                           (NO_NEW_PAGES,) * len(req.group_pages))
                    rows[req.request_id] = row
                    req.num_computed_tokens = start + 1
                    req.num_pending = pending + 1
                    budget -= 1
                    i += 1
                    continue
            num_new = min(with_pending + len(spec) - start, budget)
            if req.mm_items and self.encoder_budget is not None:
                num_new = self._encoder_cut(req, start, num_new)
            if num_new <= 0:
                i += 1
                continue
            cow = self._reserve(req, num_new)
            while cow is None:
                victim = self._pick_victim()
                vi = running.index(victim)
                if vi < i:
                    i -= 1
                budget += self._preempt(victim, rows, copies, preempted)
                running = self.running
                if victim is req:
                    break
                cow = self._reserve(req, num_new)
            if cow is None:
                continue  # req itself was preempted; running[i] is the next one
            if cow:
                copies[req.request_id] = cow
            rows[req.request_id] = self._make_row(req, num_new, with_pending)
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, rows, budget: int) -> int:
        ps = self.page_size
        while len(self.waiting) and budget > 0 and len(rows) < self.max_num_seqs:
            req = self.waiting.peek()
            if req.num_pending:
                break  # preempted with a token in flight: recompute once it is known
            seqs = req.n if self._samples_n(req) else 1
            if len(self.running) + self._unforked_children() + seqs > self.max_num_seqs:
                break
            if self.groups is not None:
                h, hit_tables = self.groups.find_hit(req)
                hits = [0] * h
            else:
                hits = self.pool.peek_prefix(req.all_token_ids, req.cache_salt,
                                             block_hashes=req.block_hashes) \
                    if self.enable_prefix_caching else []
            computed = len(hits) * ps
            num_new = req.num_tokens - computed
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            if req.mm_items and self.encoder_budget is not None:
                whole = num_new
                num_new = self._encoder_cut(req, computed, num_new)
                if num_new <= 0 or (num_new < whole and not self.enable_chunked_prefill):
                    break
            if self.groups is not None:
                cost = self.groups.admit_cost(req, len(hits), hit_tables, computed + num_new)
            else:
                need = cdiv(computed + num_new, ps) - len(hits)
                cost = need + sum(1 for p in hits if self.pool.ref_count(p) == 0)
            if cost > self.pool.num_allocatable:
                break
            if self.admit is not None and not self.admit(req, self.running):
                break
            self.waiting.pop()
            if self.groups is not None:
                self.groups.admit(req, len(hits), hit_tables, computed + num_new)
            else:
                if self.enable_prefix_caching:
                    hits = self.pool.lookup(req.all_token_ids, req.cache_salt,
                                            block_hashes=req.block_hashes)
                req.page_ids = hits + self.pool.allocate(need)
                req.num_pages_sent = 0
            req.num_computed_tokens = computed
            req.num_registered_pages = len(hits)
            if not req.first_scheduled:
                req.first_scheduled = True
                req.num_cached_tokens = computed
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            rows[req.request_id] = self._make_row(req, num_new, req.num_tokens_with_pending)
            budget -= num_new
        return budget

    def _encoder_cut(self, req: Request, start: int, num_new: int) -> int:
        """num_new cut before the first image the step's encoder budget cannot take."""
        fresh = self._encoder_left == self.encoder_budget
        num_new, used = encoder_cut(req.mm_items, start, num_new, self._encoder_left, fresh)
        self._encoder_left -= used
        return num_new

    def _unforked_children(self) -> int:
        """n > 1 children still to be forked when in-flight prompt rows land."""
        return sum(r.n - 1 for r in self.running
                   if r.n > 1 and r.parent_id is None and r.num_output_tokens == 0
                   and r.num_pending)

    def _reserve(self, req: Request, num_new: int) -> list[tuple[int, int]] | None:
        """Pages (and CoW copies) so req can write num_new tokens; None if short."""
        if self.groups is not None:
            return self.groups.reserve(req, num_new)
        ps, pool, table = self.page_size, self.pool, req.page_ids
        start = req.num_computed_tokens
        if num_new == 1:  # a decode row: at most one page written, at most one new
            j = start // ps
            if j == len(table):
                if pool.num_allocatable < 1:
                    return None
                table.extend(pool.allocate(1))
                return []
            if j < len(table) and pool.ref_count(table[j]) <= 1:
                return []  # the page is there and not shared (else: copy-on-write below)
        end = start + num_new
        need = max(0, cdiv(end, ps) - len(table))
        written = range(start // ps, min(len(table), cdiv(end, ps)))
        shared = [j for j in written if pool.ref_count(table[j]) > 1]
        if need + len(shared) > pool.num_allocatable:
            return None
        cow = []
        if shared:  # pages from the first shared one on go out again (scheduler_output.py)
            req.num_pages_sent = min(req.num_pages_sent, shared[0])
        for j in shared:
            dst, src = pool.make_writable(table, j)
            cow.append((src, dst))
        if need:
            table.extend(pool.allocate(need))
        return cow

    def _pick_victim(self) -> Request:
        if self.policy == "priority":
            return max(enumerate(self.running),
                       key=lambda e: (e[1].priority, e[1].arrival_time, e[0]))[1]
        return self.running[-1]

    def _preempt(self, req: Request, rows, copies, preempted) -> int:
        """Preempt req; return the budget its row (if any) had taken."""
        self.running.remove(req)
        row = rows.pop(req.request_id, None)
        if row is not None and row.num_samples:
            req.num_pending -= 1  # the row's placeholder goes with it
        copies.pop(req.request_id, None)
        self._free_pages(req)
        req.num_computed_tokens = 0
        req.num_registered_pages = 0
        req.spec_token_ids = []
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(req, front=True)
        preempted.append(req.request_id)
        return len(row.token_ids) if row else 0

    @staticmethod
    def _samples_n(req: Request) -> bool:
        return (req.n > 1 and req.num_output_tokens == 0 and req.num_pending == 0
                and req.parent_id is None)

    def _make_row(self, req: Request, num_new: int, with_pending: int) -> ScheduledRow:
        """The row, with the request advanced past it (and a placeholder if it samples).
        ``with_pending``: ``req.num_tokens_with_pending``."""
        start = req.num_computed_tokens
        samples = 0
        if req.spec_token_ids:
            spec = req.spec_token_ids[:max(0, num_new - (with_pending - start))]
            req.spec_token_ids = []
        else:
            spec = ()
        if start + num_new >= with_pending and not req.prefill_only:
            samples = req.n if req.n > 1 and self._samples_n(req) else 1
        table, sent = req.page_ids, req.num_pages_sent
        new_pages = table[sent:] if sent < len(table) else NO_NEW_PAGES
        req.num_pages_sent = len(table)
        groups = ()
        if self.groups is not None:
            groups = (req.group_pages, *self.groups.changes(req))
        if num_new == 1 and not spec:  # a decode row (a new or shared page, or n > 1)
            row = ScheduledRow(req.request_id, [req.token_at(start)], start, table,
                               samples, 0, sent, new_pages, *groups)
        else:
            tokens = req.get_token_ids(start, start + num_new - len(spec)) + list(spec)
            row = ScheduledRow(req.request_id, tokens, start, table, samples,
                               len(spec), sent, new_pages, *groups)
        req.num_computed_tokens = start + num_new
        if samples:
            req.num_pending += 1
        return row

    # ---- introspection -----------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def stats(self) -> PoolStats:
        return self.pool.stats()

    def kv_capacity(self) -> dict:
        """What the pool holds, as vLLM reports it: pages one request of max_model_len
        tokens needs (every KV group), the maximum concurrency at that length, and the
        tokens of those requests together."""
        usable, length = self.pool.num_usable_pages, self.max_model_len
        per = self.groups.pages_per_seq(length) if self.groups is not None \
            else cdiv(length, self.page_size)
        concurrency = usable / per
        tokens = usable * self.page_size if self.groups is None else int(concurrency * length)
        return {"pages_per_request": per, "max_concurrency": concurrency, "tokens": tokens}

    def kv_waste(self) -> float:
        """Allocated-but-unfilled slots / allocated slots over running requests.

        A page shared by several tables counts once, filled as far as its
        fullest owner has computed.
        """
        ps, fill = self.page_size, {}
        for req in self.running:
            for j, page in enumerate(req.page_ids):
                filled = min(ps, max(0, req.num_computed_tokens - j * ps))
                fill[page] = max(fill.get(page, 0), filled)
        if not fill:
            return 0.0
        return 1.0 - sum(fill.values()) / (len(fill) * ps)

    # -- update: a step's sampled tokens in ------------------------------------------

    def update(self, output: SchedulerOutput, sampled: dict[str, list[int]]) -> list[Request]:
        changed: list[Request] = []
        finished_waiting = []
        requests, caching, page_size = self.requests, self.enable_prefix_caching, self.page_size
        RUNNING = RequestStatus.RUNNING
        any_finished = False
        for row in output.rows:
            req = requests.get(row.request_id)
            if req is None:
                continue  # finished or aborted since it was scheduled
            if caching and req.num_computed_tokens >= (req.num_registered_pages + 1) * page_size \
                    and req.status is RUNNING:
                self._register(req)  # (only when a page may have filled up)
            num_samples = row.num_samples
            if num_samples == 0:
                if req.prefill_only and req.status is RUNNING and \
                        row.start_pos + len(row.token_ids) >= req.num_prompt_tokens:
                    req.finish(RequestStatus.FINISHED_LENGTH)  # its prompt is computed
                    self._release(req)
                    changed.append(req)
                    any_finished = True
                continue
            tokens = sampled.get(row.request_id, ())
            if row.num_spec:
                self._update_spec(req, row, [tokens] if tokens.__class__ is int else list(tokens),
                                  changed)
                any_finished = True  # cheap to re-check below
                continue
            if req.num_pending < 1:
                raise ValueError(f"request {row.request_id!r}: update() without a placeholder; "
                                 "call update() once per schedule(), in order")
            if tokens.__class__ is int:  # one token as a plain int (the common row)
                req.num_pending -= 1
                outs = req.output_token_ids
                outs.append(tokens)
                # check_stop's own tests, first without the call (it can fire only then)
                if tokens in req.finisher_ids or \
                        len(req.prompt_token_ids) + len(outs) >= req.max_num_tokens:
                    any_finished |= self._stop_if_done(req, finished_waiting)
                changed.append(req)
                continue
            if not 1 <= len(tokens) <= num_samples:
                raise ValueError(f"request {row.request_id!r}: expected {num_samples} "
                                 f"sampled token(s), got {len(tokens)}")
            if len(tokens) == 1:
                family = (req,)
            else:
                end = row.start_pos + len(row.token_ids)
                family = [req] + self._fork_children(req, len(tokens) - 1, end)
            req.num_pending -= 1
            for member, token in zip(family, tokens):
                member.output_token_ids.append(int(token))
                any_finished |= self._stop_if_done(member, finished_waiting)
                changed.append(member)
        for req in finished_waiting:
            self.waiting.remove(req)
        if any_finished:
            self.running = [r for r in self.running if not r.is_finished]
        return changed

    def _stop_if_done(self, req: Request, finished_waiting: list[Request]) -> bool:
        """Finish ``req`` if its last token ends it (EOS, stop token, length) and give
        back its pages; one preempted meanwhile goes to ``finished_waiting``."""
        was_waiting = req.status is not RequestStatus.RUNNING
        if not req.check_stop():
            return False
        if was_waiting:
            finished_waiting.append(req)
        self._release(req)
        return True

    def _update_spec(self, req: Request, row: ScheduledRow, tokens: list[int],
                     changed: list[Request]) -> None:
        """A verified speculative row: ``tokens`` are the accepted proposals and one
        more. The rejected positions are rolled back (num_computed_tokens, and the
        pages that hold only rejected positions are freed); EOS, stop tokens and
        length limits apply token by token, later tokens are dropped."""
        if not 1 <= len(tokens) <= row.num_spec + 1:
            raise ValueError(f"request {row.request_id!r}: expected 1..{row.num_spec + 1} "
                             f"tokens for a speculative row, got {len(tokens)}")
        if req.num_pending != 1 or req.status != RequestStatus.RUNNING:
            raise ValueError(f"request {row.request_id!r}: speculative rows need serial steps")
        req.num_pending = 0
        req.num_computed_tokens -= row.num_spec + 1 - len(tokens)
        for token in tokens:
            req.append_output_token(token)
            if req.check_stop():
                self._release(req)
                break
        else:
            keep = cdiv(req.num_computed_tokens, self.page_size)
            if self.groups is not None:
                self.groups.truncate(req, keep)
            elif len(req.page_ids) > keep:
                self.pool.free(req.page_ids[keep:])
                del req.page_ids[keep:]
                req.num_pages_sent = min(req.num_pages_sent, keep)
        changed.append(req)

    def _register(self, req: Request) -> None:
        if self.groups is not None:
            self.groups.register(req)
            return
        known = min(req.num_computed_tokens, req.num_tokens)  # placeholders have no content yet
        ps = self.page_size
        full = min(known // ps, len(req.page_ids))
        start = req.num_registered_pages
        if full > start:
            # Only the tokens of the pages to hash (not the whole sequence's list).
            offset = min(start, len(req.block_hashes)) * ps
            self.pool.register(req.page_ids, req.get_token_ids(offset, full * ps), known,
                               req.cache_salt, block_hashes=req.block_hashes,
                               start_page=start, token_offset=offset)
            req.num_registered_pages = full

    def _fork_children(self, parent: Request, count: int, computed: int) -> list[Request]:
        """n > 1 children of a prompt row that ended at ``computed`` tokens (the
        parent may have moved on since: a row in flight, or a preemption)."""
        children = []
        for i in range(1, count + 1):
            child_id = f"{parent.request_id}-{i}"
            k = 1
            while child_id in self.requests:
                child_id, k = f"{parent.request_id}-{i}.{k}", k + 1
            child = parent.fork(child_id, sample_index=i)
            child.num_pending = 0
            self.requests[child_id] = child
            if parent.status == RequestStatus.RUNNING:
                child.num_computed_tokens = computed
                if self.groups is not None:
                    self.groups.fork(parent, child, cdiv(computed, self.page_size))
                else:
                    child.page_ids = self.pool.fork(
                        parent.page_ids[:cdiv(computed, self.page_size)])
                child.num_registered_pages = min(child.num_registered_pages, len(child.page_ids))
                child.status = RequestStatus.RUNNING
                self.running.append(child)
            else:  # the parent was preempted meanwhile: the child recomputes too
                child.num_computed_tokens = 0
                child.num_registered_pages = 0
                child.status = RequestStatus.PREEMPTED
                self.waiting.push(child, front=True)
            children.append(child)
        return children
