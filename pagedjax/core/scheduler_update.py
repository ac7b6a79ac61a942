"""The scheduler's second half: ``update()`` applies a step's sampled tokens.

It registers newly full pages in the prefix cache, turns placeholders into the
sampled tokens, forks n > 1 requests when their prompt completes (the parent
stays sample 0; children ``f"{id}-{i}"`` get ``parent_id``, ``sample_index``
and the parent's pages through ``PagePool.fork``), rolls back rejected
speculative positions, applies the stop rules (``Request.check_stop``) and
frees the pages of finished requests. ``UpdateMixin`` is one half of
:class:`pagedjax.core.scheduler.Scheduler` (the state lives there); ``schedule()``
is the other half, in ``scheduler.py``.
"""

from __future__ import annotations

from pagedjax.core.request import Request, RequestStatus
from pagedjax.core.scheduler_output import ScheduledRow, SchedulerOutput


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class UpdateMixin:
    """``Scheduler.update`` and its helpers (see the module docstring)."""

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
                family, tokens = (req,), (tokens,)
            elif not 1 <= len(tokens) <= num_samples:
                raise ValueError(f"request {row.request_id!r}: expected {num_samples} "
                                 f"sampled token(s), got {len(tokens)}")
            elif len(tokens) == 1:
                family = (req,)
            else:
                end = row.start_pos + len(row.token_ids)
                family = [req] + self._fork_children(req, len(tokens) - 1, end)
            req.num_pending -= 1
            for member, token in zip(family, tokens):
                member.output_token_ids.append(int(token))
                was_waiting = member.status is not RUNNING
                if member.check_stop():
                    any_finished = True
                    if was_waiting:
                        finished_waiting.append(member)
                    self._release(member)
                changed.append(member)
        for req in finished_waiting:
            self.waiting.remove(req)
        if any_finished:
            self.running = [r for r in self.running if not r.is_finished]
        return changed

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
            keep = _cdiv(req.num_computed_tokens, self.page_size)
            if len(req.page_ids) > keep:
                self.pool.free(req.page_ids[keep:])
                req.page_ids = req.page_ids[:keep]  # a new list (scheduler_output.py)
        changed.append(req)

    def _register(self, req: Request) -> None:
        known = min(req.num_computed_tokens, req.num_tokens)  # placeholders have no content yet
        full = min(known // self.page_size, len(req.page_ids))
        if full > req.num_registered_pages:
            self.pool.register(req.page_ids, req.all_token_ids, known,
                               req.cache_salt, block_hashes=req.block_hashes,
                               start_page=req.num_registered_pages)
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
                child.page_ids = self.pool.fork(parent.page_ids[:_cdiv(computed, self.page_size)])
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
