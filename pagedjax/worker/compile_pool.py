"""Warm-up in the background: serve while the rarer programs compile.

A :class:`CompilePool` runs warm-up's compile jobs (``warmup.compile_jobs``: key
-> job) on a few background threads, in the order given (the shapes a first
request needs first). Steps go on meanwhile: before a step dispatches a
program, the runner calls :meth:`CompilePool.need` with its key, which

* returns at once when that program is built (or is not one of warm-up's);
* compiles it in the calling thread when no worker has taken it yet (the step
  jumps the queue instead of waiting behind rarer programs);
* waits for that one program only when a worker is compiling it.

The workers run at the steps' own OS priority: a step waiting for a
program a worker builds must not wait behind a starved thread. Once every job
has run (:attr:`done`), nothing compiles inside a step any more,
as after a warm-up done up front. A job that fails is logged and left to the
step that needs it, which compiles it through its own call and raises there.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Callable, Hashable

logger = logging.getLogger("pagedjax.worker.compile_pool")


class CompilePool:
    """Compile ``jobs`` (key -> job, in order) on ``workers`` daemon threads."""

    def __init__(self, jobs: dict[Hashable, Callable[[], object]], workers: int,
                 on_done: Callable[["CompilePool"], None] | None = None):
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self._lock = threading.Lock()
        self._pending = dict(jobs)  # key -> job, not started (insertion order = priority)
        self._running: dict[Hashable, threading.Event] = {}
        self._on_done = on_done
        self.total = len(jobs)
        self.completed = 0
        self.compiled_in_step = 0  # jobs a step ran itself, ahead of the queue
        self.failed: list[Hashable] = []
        self.cancelled = 0  # jobs dropped by cancel() before they started
        self.started = time.perf_counter()
        self.seconds: float | None = None  # wall seconds until the last job ended
        self.done = threading.Event()
        self._finished = False
        if not jobs:
            self._finish()
        self.threads = [threading.Thread(target=self._work, name=f"pagedjax-compile-{i}",
                                          daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()
        # At exit, stop before the interpreter (and JAX's backends) go away.
        atexit.register(_close_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ steps
    def need(self, key: Hashable) -> None:
        """Return once the program ``key`` is built (see the module docstring)."""
        if self.done.is_set():
            return
        with self._lock:
            job = self._pending.pop(key, None)
            event = self._running.get(key)
            if job is not None:
                event = self._running[key] = threading.Event()
                self.compiled_in_step += 1
        if job is not None:
            self._run(key, job, event)
        elif event is not None:
            event.wait()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every job has run (True), or ``timeout`` seconds (False)."""
        return self.done.wait(timeout)

    def cancel(self) -> None:
        """Drop the jobs not started (the engine is going away); running ones finish."""
        with self._lock:
            dropped = len(self._pending)
            self._pending.clear()
            self.completed += dropped
            self.cancelled += dropped
            last = dropped and not self._running and self.completed == self.total
        if last:
            self._finish()

    def close(self, timeout: float = 60.0) -> None:
        """Cancel the jobs not started and wait (up to ``timeout`` s) for the running ones."""
        self.cancel()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                key = next(iter(self._pending))
                job = self._pending.pop(key)
                event = self._running[key] = threading.Event()
            self._run(key, job, event)

    def _run(self, key: Hashable, job: Callable[[], object], event: threading.Event) -> None:
        try:
            job()
        except Exception:  # noqa: BLE001 - the step that needs it compiles it and raises
            if not self.cancelled:  # (not while the engine is going away)
                logger.warning("background compilation of %r failed; it compiles on first "
                               "use", key, exc_info=True)
            with self._lock:
                self.failed.append(key)
        finally:
            with self._lock:
                self._running.pop(key, None)
                self.completed += 1
                last = self.completed == self.total and not self._pending
            event.set()
            if last:
                self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self.seconds = time.perf_counter() - self.started
        self.done.set()
        if self._on_done is not None:
            self._on_done(self)


def _close_at_exit(ref: "weakref.ref[CompilePool]") -> None:
    pool = ref()
    if pool is not None:
        pool.close()

