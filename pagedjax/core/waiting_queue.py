"""The scheduler's waiting queue: FCFS, or by (priority, arrival) (host side, no JAX)."""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from pagedjax.core.request import Request


class WaitingQueue:
    """FCFS deque, or a (priority, arrival, insertion) heap."""

    def __init__(self, by_priority: bool) -> None:
        self._by_priority = by_priority
        self._deque: deque[Request] = deque()
        self._heap: list[tuple] = []
        self._seq = itertools.count()

    def push(self, req: Request, front: bool = False) -> None:
        if self._by_priority:
            # first insertion order, kept when a preempted request comes back
            if req.waiting_seq is None:
                req.waiting_seq = next(self._seq)
            seq = req.waiting_seq
            heapq.heappush(self._heap, (req.priority, req.arrival_time, seq, req))
        elif front:
            self._deque.appendleft(req)
        else:
            self._deque.append(req)

    def peek(self) -> Request:
        return self._heap[0][-1] if self._by_priority else self._deque[0]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1] if self._by_priority else self._deque.popleft()

    def remove(self, req: Request) -> None:
        if self._by_priority:
            self._heap = [e for e in self._heap if e[-1] is not req]
            heapq.heapify(self._heap)
        else:
            self._deque.remove(req)

    def __len__(self) -> int:
        return len(self._heap) if self._by_priority else len(self._deque)

    def __iter__(self):
        if self._by_priority:
            return iter([e[-1] for e in sorted(self._heap, key=lambda e: e[:3])])
        return iter(list(self._deque))
