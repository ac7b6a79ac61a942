"""Instruments of ``host_overhead.py``, for the engine of the process they run in.

Times vary 1.3-2x between fresh processes of the same code on a shared VM; the
counts here do not, so two checkouts can be compared exactly on them:

* ``tracked_allocations``: net allocations of GC-tracked objects in one step;
* ``python_work``: Python bytecodes executed and Python-level calls made in one
  step (``sys.settrace`` with opcode events; C code, such as numpy's and XLA's,
  is not counted, and the traced step itself runs many times slower).

Also the wrappers that time the host phases, the garbage collector and (on an
older checkout) the runner's jitted calls. They are set on the engine's objects
(and on ``pagedjax.sample.sampler.build_sampling_tensors``) in the benchmark's own
process only.
"""

from __future__ import annotations

import sys
import time


def tracked_allocations(engine) -> int:
    """Allocations less deallocations of GC-tracked objects (containers: lists, outputs,
    rows) in one more step, with the collector paused: CPython's young-generation
    counter (``gc.get_count()[0]``, which does not go below zero). Unlike the times it
    does not vary between processes of the same code (``combine`` keeps each
    process's figure), so it compares checkouts without their noise."""
    import gc

    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        engine.step()
        return gc.get_count()[0] - before
    finally:
        gc.enable()


class Patches:
    """The attributes this benchmark replaced (its wrappers), put back by ``undo()``
    before the counted steps, so that the counts hold the engine's work only."""

    def __init__(self):
        self._saved: list[tuple] = []

    def set(self, obj, name: str, value) -> None:
        own = name in getattr(obj, "__dict__", {})
        self._saved.append((obj, name, own, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self) -> None:
        for obj, name, own, old in reversed(self._saved):
            if own:
                setattr(obj, name, old)
            else:
                delattr(obj, name)  # the class's attribute shows again
        self._saved.clear()


def instrument_phases(engine, patches: Patches) -> dict:
    """Wrap the engine's host phases (this benchmark process only, through
    ``patches``) to sum their wall time; a name an older checkout lacks is skipped."""
    from pagedjax.sample import sampler

    totals: dict[str, float] = {}
    batch = getattr(engine.runner, "input_batch", None)  # the persistent batch, if any
    targets = [("schedule", engine.scheduler, "schedule"), ("prepare", engine.runner, "prepare"),
               ("prepare", engine.runner, "prepare_step"),
               ("sampling_tensors", sampler, "build_sampling_tensors"),
               ("sampling_tensors", batch, "step_sampling"),
               ("update", engine.scheduler, "update"),
               ("process", getattr(engine, "processor", None), "process")]
    for key, obj, name in targets:
        fn = getattr(obj, name, None) if obj is not None else None
        if fn is None:
            continue
        totals.setdefault(key, 0.0)

        def timed(*a, _fn=fn, _key=key, **kw):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                totals[_key] += time.perf_counter() - t0
        patches.set(obj, name, timed)
    return totals


class CountGC:
    """Collections of the cyclic garbage collector, and their wall time, until stop()."""

    def __init__(self):
        import gc

        self.count, self.seconds, self._t0, self._gc = 0, 0.0, 0.0, gc
        gc.callbacks.append(self._cb)

    def _cb(self, phase, _info):
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0

    def stop(self):
        self._gc.callbacks.remove(self._cb)


def timed_dispatch(runner, fn):
    """``fn`` (a runner's jitted call on an older checkout) adding its wall and CPU
    time to ``runner.dispatch_seconds`` / ``dispatch_cpu_seconds``."""
    def call(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            runner.dispatch_seconds += time.perf_counter() - t0
            runner.dispatch_cpu_seconds += time.thread_time() - c0
    return call


def python_work(engine) -> tuple[int, int]:
    """(bytecodes, Python calls) executed in one more ``engine.step()``, traced."""
    counts = [0, 0]

    def trace(frame, event, _arg):
        if event == "opcode":
            counts[0] += 1
        elif event == "call":
            counts[1] += 1
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        return trace

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        engine.step()
    finally:
        sys.settrace(old)
    return counts[0], counts[1]
