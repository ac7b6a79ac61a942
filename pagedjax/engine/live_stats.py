"""Live statistics for dashboards: the latest pool snapshot and rolling series.

``LiveStats`` is a stat logger (AsyncLLM's ``on_step`` / ``on_finished`` /
``on_error`` interface), so it runs on the engine thread, the only one that may
read the engine. After a step it

* appends a point to the rolling series at most every ``interval`` seconds:
  generated and prompt tokens per second over the interval, batch size (running
  requests), KV usage, waiting requests, preemptions, and the mean TTFT and
  inter-token latency of the requests that finished in it;
* builds a full :func:`~pagedjax.engine.pool_snapshot.pool_snapshot` when
  somebody watches (``watch()``) and the interval has passed, and always when
  the engine has just gone idle, so the last picture is never stale.

Readers on other threads call ``latest()`` (snapshot, points newer than a
sequence number); nothing there touches the engine. ``StatLoggers`` hands the
engine's calls to several loggers (Prometheus metrics and this).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Optional

from pagedjax.engine.pool_snapshot import pool_snapshot

DEFAULT_INTERVAL_S = 0.25
DEFAULT_WINDOW_S = 300.0


def _kv_usage(pool) -> float:
    """Pages held / usable pages, in O(1) (PoolStats counts shared pages: a pass over all)."""
    total = pool.num_usable_pages
    return (total - pool.num_allocatable) / total if total else 0.0


class StatLoggers:
    """Several stat loggers behind one (each gets every call, in order)."""

    def __init__(self, *loggers):
        self.loggers = [lg for lg in loggers if lg is not None]

    def on_step(self, engine, num_requests: int) -> None:
        for lg in self.loggers:
            lg.on_step(engine, num_requests)

    def on_finished(self, output, seqs=None) -> None:
        for lg in self.loggers:
            lg.on_finished(output, seqs)

    def on_error(self) -> None:
        for lg in self.loggers:
            lg.on_error()


class LiveStats:
    def __init__(self, interval: float = DEFAULT_INTERVAL_S, window_s: float = DEFAULT_WINDOW_S):
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.interval = interval
        self._lock = threading.Lock()
        self._points: collections.deque = collections.deque(maxlen=max(1, int(window_s / interval)))
        self._seq = 0  # sequence number of the newest point
        self._snapshot: Optional[dict] = None
        self._watchers = 0
        self._last_point = self._last_snapshot = 0.0
        self._base: Optional[tuple] = None  # (time, generated, prompt) of the previous point
        self._finished: list[tuple] = []  # (ttft, itl) since the previous point
        self._was_idle = True
        self.num_errors = 0

    # ---------------------------------------------------------------- readers
    @contextlib.contextmanager
    def watch(self):
        """While open, full snapshots are built every ``interval`` seconds."""
        with self._lock:
            self._watchers += 1
        try:
            yield self
        finally:
            with self._lock:
                self._watchers -= 1

    @property
    def watchers(self) -> int:
        return self._watchers

    @property
    def idle(self) -> bool:
        """True when the engine had no unfinished request after its last step (then the
        kept snapshot is current)."""
        return self._was_idle

    def latest(self, after: int = 0) -> tuple[Optional[dict], list[dict], int]:
        """(newest snapshot or None, points with sequence number > after, newest number)."""
        with self._lock:
            first = self._seq - len(self._points) + 1
            pts = list(self._points)[max(0, after + 1 - first):]
            return self._snapshot, pts, self._seq

    # ---------------------------------------------------------------- engine thread
    def on_step(self, engine, num_requests: int) -> None:
        now = time.monotonic()
        idle = not engine.has_unfinished_requests()
        went_idle = idle and not self._was_idle
        if self._was_idle and not idle and self._base is not None:
            # After an idle gap the rate counts from one interval back, not from the gap.
            t0, gen0, prompt0 = self._base
            self._base = (max(t0, now - self.interval), gen0, prompt0)
        self._was_idle = idle
        if went_idle or now - self._last_point >= self.interval:
            self._add_point(engine, now)
        if went_idle or self._snapshot is None or (
                self._watchers and now - self._last_snapshot >= self.interval):
            cpu = time.thread_time()
            snap = pool_snapshot(engine)
            snap["idle"] = idle
            snap["build_ms"] = (time.thread_time() - cpu) * 1e3  # engine-thread CPU time it took
            self._last_snapshot = now
            with self._lock:
                self._snapshot = snap

    def on_finished(self, output, seqs=None) -> None:
        m = output.metrics
        if m is None or m.first_token_time is None:
            return
        ttft = max(0.0, m.first_token_time - m.arrival_time)
        if seqs is None:
            seqs = [(o.finish_reason, len(o.token_ids)) for o in output.outputs]
        ntok = max((n for _, n in seqs), default=0)
        itl = None
        if m.finished_time is not None and ntok > 1:
            itl = max(0.0, m.finished_time - m.first_token_time) / (ntok - 1)
        self._finished.append((ttft, itl))

    def on_error(self) -> None:
        self.num_errors += 1

    def _add_point(self, engine, now: float) -> None:
        sch = engine.scheduler
        gen, prompt = engine.num_generated_tokens, engine.num_prompt_tokens
        t0, gen0, prompt0 = self._base or (now - self.interval, gen, prompt)
        dt = max(now - t0, 1e-6)
        ttfts = [f[0] for f in self._finished]
        itls = [f[1] for f in self._finished if f[1] is not None]
        self._finished = []
        point = {"t": time.time(), "tokens_per_s": (gen - gen0) / dt,
                 "prompt_tokens_per_s": (prompt - prompt0) / dt,
                 "batch": sch.num_running, "waiting": sch.num_waiting,
                 "kv_usage": _kv_usage(sch.pool), "preemptions": sch.num_preemptions,
                 "ttft": sum(ttfts) / len(ttfts) if ttfts else None,
                 "itl": sum(itls) / len(itls) if itls else None}
        self._base = (now, gen, prompt)
        self._last_point = now
        with self._lock:
            self._seq += 1
            point["seq"] = self._seq
            self._points.append(point)
