"""The dashboard's view in a Jupyter notebook: the page pool and the plots, live.

    from pagedjax.entrypoints.notebook import PoolView

    view = PoolView(llm)               # an LLM or an AsyncLLM
    view.show()                        # one output that redraws itself
    with view.watch():                 # LLM: redraws while generate() runs
        llm.generate(prompts, params)

For an ``LLM`` the view wraps its engine's ``step`` inside ``watch()`` (the
generate loop runs in the cell, so the picture is taken between steps, on the
thread that owns the engine). For an ``AsyncLLM`` it joins the engine thread's
stat loggers (:class:`~pagedjax.engine.live_stats.LiveStats`) and ``show()``
starts a task on the running event loop (Jupyter's) that redraws every
``interval`` seconds until ``close()``. ``html()`` is the current picture as
HTML (``pool_html.render``); outside Jupyter nothing is displayed but frames are
still counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Optional

from pagedjax.engine.live_stats import LiveStats, StatLoggers
from pagedjax.entrypoints import pool_html


class PoolView:
    def __init__(self, llm, interval: float = 0.25):
        self.live = LiveStats(interval=interval)
        self.interval = interval
        self.frames = 0  # pictures drawn
        self.seen: list[dict] = []  # the counts of every picture drawn
        self._handle = None
        self._task: Optional[asyncio.Task] = None
        self._drawn = None
        if hasattr(llm, "llm_engine"):  # LLM: driven in this thread
            self.engine, self.async_llm = llm.llm_engine, None
            self.live.on_step(self.engine, 0)
        elif hasattr(llm, "stat_logger") and hasattr(llm, "engine"):  # AsyncLLM
            self.engine, self.async_llm = None, llm
            llm.stat_logger = StatLoggers(llm.stat_logger, self.live)
        else:
            raise TypeError(f"PoolView needs an LLM or an AsyncLLM, got {type(llm).__name__}")

    # ---------------------------------------------------------------- pictures
    def html(self) -> str:
        snap, points, _ = self.live.latest()
        return pool_html.render(snap, points)

    def _repr_html_(self) -> str:
        return self.html()

    def refresh(self, force: bool = False) -> bool:
        """Redraw if the snapshot changed (or ``force``); True when drawn."""
        snap = self.live.latest()[0]
        if snap is None or (snap is self._drawn and not force):
            return False
        self._drawn = snap
        self.frames += 1
        self.seen.append(dict(snap["counts"]))
        if self._handle is not None:
            from IPython.display import HTML

            self._handle.update(HTML(self.html()))
        return True

    def show(self) -> "PoolView":
        """Display the view (in Jupyter); an AsyncLLM's view then keeps itself current."""
        try:
            from IPython import get_ipython
            from IPython.display import HTML, display

            if get_ipython() is not None:
                self._handle = display(HTML(self.html()), display_id=True)
        except ImportError:
            pass
        if self.async_llm is not None and self._task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._task = loop.create_task(self._follow())
        return self

    async def _follow(self) -> None:
        with self.live.watch():
            while True:
                self.refresh()
                await asyncio.sleep(self.interval)

    def close(self) -> None:
        """Stop following an AsyncLLM (the last picture stays)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.refresh()

    # ---------------------------------------------------------------- LLM
    @contextlib.contextmanager
    def watch(self):
        """Redraw between the engine's steps while the block runs (LLM), or build
        snapshots every interval (AsyncLLM)."""
        if self.engine is None:
            with self.live.watch():
                yield self
            self.refresh()
            return
        engine, live = self.engine, self.live
        step = engine.step
        own = vars(engine).get("step")  # a wrapper somebody put on this engine, if any

        def watched_step():
            outputs = step()
            for out in outputs:
                if out.finished:
                    live.on_finished(out)
            live.on_step(engine, 0)
            self.refresh()
            return outputs

        engine.step = watched_step
        try:
            with live.watch():
                yield self
        finally:
            if own is None:
                del engine.step  # the class's method again
            else:
                engine.step = own
            live.on_step(engine, 0)
            self.refresh(force=True)
