"""A compact picture of the page pool and the scheduler, for live views.

``pool_snapshot(engine)`` reads the engine's public statistics (the scheduler's
running and waiting requests, the pool's reference counts and prefix-cache
marks, the engine's counters) and returns plain JSON-ready data:

* ``grid``: one character per usable page (page ids 1..total, in order):
  ``.`` free, ``c`` cached (free, holds reusable prefix content), ``u`` used,
  ``p`` used and registered in the prefix cache (a later prompt can share it);
* ``refs``: ``{page id: reference count}`` for pages held more than once
  (shared: forked sequences, prefix hits, beams);
* ``requests``: running then waiting, each with its pages and progress;
* ``counts``: what the grid adds up to, plus running / waiting / preemptions.

Call it on the thread that steps the engine (the engine is not thread-safe):
:class:`~pagedjax.engine.live_stats.LiveStats` does so from AsyncLLM's engine
thread; a synchronous caller may call it between steps.
"""

from __future__ import annotations

import time

FREE, CACHED, USED, USED_PREFIX = ".", "c", "u", "p"


def _grid(pool) -> tuple[str, dict[str, int]]:
    refs = pool.ref_counts
    cells = []
    shared = {}
    for page in range(1, pool.num_pages):
        r = refs[page]
        if r == 0:
            cells.append(CACHED if pool.is_cached(page) else FREE)
        else:
            cells.append(USED_PREFIX if pool.is_cached(page) else USED)
            if r > 1:
                shared[str(page)] = r
    return "".join(cells), shared


def _request(req, state: str) -> dict:
    max_tokens = req.max_num_tokens - req.num_prompt_tokens
    return {"id": req.request_id, "state": state, "prompt_tokens": req.num_prompt_tokens,
            "output_tokens": req.num_output_tokens, "computed_tokens": req.num_computed_tokens,
            "max_tokens": max_tokens if max_tokens < 1 << 40 else None,
            "cached_tokens": req.num_cached_tokens, "preemptions": req.num_preemptions,
            # every KV group's pages (hybrid models; 0: given back by a sliding group)
            "pages": [p for t in (req.page_ids, *req.group_pages) for p in t if p]}


def pool_snapshot(engine) -> dict:
    """The pool grid, the requests and the engine's counters (see the module doc)."""
    sch = engine.scheduler
    pool = sch.pool
    grid, shared = _grid(pool)
    running = [_request(r, "running") for r in sch.running]
    waiting = [_request(r, "preempted" if r.num_preemptions else "waiting") for r in sch.waiting]
    return {
        "time": time.time(),
        "page_size": pool.page_size,
        "grid": grid,
        "refs": shared,
        "requests": running + waiting,
        "counts": {
            "total": pool.num_usable_pages, "free": grid.count(FREE),
            "cached": grid.count(CACHED),
            "used": len(grid) - grid.count(FREE) - grid.count(CACHED),
            "shared": len(shared), "running": len(running), "waiting": len(waiting),
            "preemptions": sch.num_preemptions, "steps": engine.num_steps,
            "prompt_tokens": engine.num_prompt_tokens,
            "generated_tokens": engine.num_generated_tokens,
        },
    }
