"""Warm-up: compile every program a runner's steps can run, before the first request
(or, with :func:`start_background`, while the first requests are served).

A step runs up to three programs (runner.py): the model program of its
padded shape (the expensive one), the sampler program of its logits rows,
sampling rows and sampler variant, and page copies for n > 1 forks; a
vision-language model adds the vision encoder (per patch bucket) and the
gather of the step's image rows (per token bucket and encoder output size,
``mm_programs.py``). Warm-up
lists each distinct program once -- the model program of every step shape
(``step_shapes``), the common sampler variants (``WARM_SAMPLING``) at every
row bucket, the page copies -- and compiles them with ``jax.jit(...).lower(
...).compile()`` on a pool of threads (XLA compiles with the GIL released,
so the compilations run side by side and the Python tracing of one job
overlaps the compilation of another). Nothing is executed. The jitted
calls of later steps find these executables in jit's caches: no compilation
after warm-up (tests/worker/test_runner.py, tests/worker/test_warmup.py).

Penalties, logit bias / bad words and allowed_token_ids compile on first use.
On the CPU platform the C++ draw makes min-p, top-k and top-p share one
program with plain temperature sampling (``sampler.program_flags``).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable

from pagedjax.worker import programs
from pagedjax.worker.inputs import LOGPROB_BUCKETS, Buckets, SampleRow, pow2
from pagedjax.sample.sampler import RowState, build_sampling_tensors
from pagedjax.sampling_params import SamplingParams
from pagedjax.utils import cdiv

# Sampler variants compiled at warm-up: (SamplingParams kwargs, logprobs).
WARM_SAMPLING = (
    (dict(temperature=0.0), None), (dict(temperature=1.0), None),
    (dict(temperature=0.8, top_p=0.95), None),
    (dict(temperature=0.0), 20), (dict(temperature=1.0), 20),
    (dict(temperature=0.8, top_p=0.95), 20),
)


def default_workers() -> int:
    """Threads that compile at once: the usable cores, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def step_shapes(buckets: Buckets, max_num_seqs: int) -> list[tuple[int, int, int, bool]]:
    """Every (rows, tokens, pages, decode) combination whose bucket can occur."""
    shapes = set()
    s_max = pow2(max_num_seqs, 1)
    for p in buckets.p_buckets():
        s = 1
        while s <= s_max:
            shapes.add((s, s, p, True))
            s *= 2
        s = 8  # mixed steps pad rows to at least 8
        while s <= max(s_max, 8):
            for t in buckets.t_buckets():
                if s <= t:
                    shapes.add((s, t, p, False))
            s *= 2
    return sorted(shapes)


def dummy_rows(buckets: Buckets, s: int, t: int, p: int, decode: bool):
    """Rows (all on the null page) whose padded shape is exactly (s, t, p), or None
    when no step has that shape."""
    from pagedjax.core.scheduler import ScheduledRow

    page_size = buckets.page_size
    cap = p * page_size
    if decode:
        rows = [ScheduledRow(f"w{i}", [0], 0, [0], 1) for i in range(s)]
        rows[0] = ScheduledRow("w0", [0], cap - 1, [0] * p, 1)
        return rows
    nrows = s if t > s else s - 1
    counts = [t // nrows + (1 if i < t % nrows else 0) for i in range(nrows)]
    if max(counts) < 2 or max(counts) > cap:
        return None
    rows = [ScheduledRow(f"w{i}", [0] * c, 0, [0] * cdiv(c, page_size), 1)
            for i, c in enumerate(counts)]
    rows[0] = ScheduledRow("w0", [0] * counts[0], cap - counts[0], [0] * p, 1)
    if buckets.bucket_sizes(nrows, t, p, False) != (t, s, p):
        return None
    return rows


def row_buckets(max_num_seqs: int) -> list[int]:
    """The model's row buckets S (decode steps from 1, mixed steps from 8)."""
    return [1 << i for i in range(pow2(max_num_seqs, 8).bit_length())]


def sampler_rows(max_num_seqs: int) -> list[tuple[int, int]]:
    """(logits rows, sampling rows) pairs warm-up compiles: logits rows are the
    model's row buckets S, sampling rows are padded to >= max(8, S)
    (inputs.prepare) and reach twice S when n > 1 prompts fork."""
    return [(s, r) for s in row_buckets(max_num_seqs)
            for r in sorted({max(8, s), max(8, 2 * s)})]


def background_workers() -> int:
    """Threads of a warm-up in the background: half the compiling threads (at least
    one), the other cores run the steps being served meanwhile."""
    return max(1, default_workers() // 2)


def compile_jobs(runner, shapes=None, order: str = "largest") -> dict[tuple, Callable[[], object]]:
    """Each distinct program of warm-up once: key -> a job that compiles it.
    ``shapes``: the step shapes (default ``step_shapes``); the sampler and
    page-copy programs are always all listed. ``order``: "largest" (the longest
    compilations first: a pool working through all of them balances best) or
    "first_request" (what a first short request needs first: the sampler of a
    few rows, then model programs from the smallest, tokens x pages)."""
    if order not in ("largest", "first_request"):
        raise ValueError(f"order must be 'largest' or 'first_request', got {order!r}")
    jobs, sizes = _jobs(runner, shapes if shapes is not None else runner.warmup_shapes())
    if order == "largest":
        return jobs

    def rank(key):
        if key[0] == "sampler":
            return (0 if key[1] <= 8 and key[3] is None else 2, key[1])
        if key[0] == "model":
            return (1, sizes[key])
        return (3, 0)

    return dict(sorted(jobs.items(), key=lambda kv: rank(kv[0])))


def _jobs(runner, shapes) -> tuple[dict[tuple, Callable[[], object]], dict[tuple, tuple]]:
    """(key -> job, model key -> (tokens x pages, rows) of its shape)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=1)
    jobs: dict[tuple, Callable[[], object]] = {}
    sizes: dict[tuple, tuple[int, int]] = {}
    # Largest model programs first: they take longest, the pool then balances.
    for s, t, p, decode in sorted(shapes, key=lambda x: (-x[1], -x[0])):
        rows = dummy_rows(runner.buckets, s, t, p, decode)
        if rows is None:
            continue
        srows = [SampleRow(r.request_id, i, RowState(greedy, [0], []), None)
                 for i, r in enumerate(rows)]
        key, job = programs.model_compile_job(runner, rows, srows)
        jobs.setdefault(key, job)
        sizes.setdefault(key, (t * p, s))
    for s, r in sampler_rows(runner.max_num_seqs):
        for kw, lp in WARM_SAMPLING:
            params = SamplingParams(max_tokens=1, logprobs=lp, **kw)
            st = build_sampling_tensors([RowState(params, [0], [])], r, runner.vocab_size,
                                        runner.max_model_len)
            num_logprobs = None if lp is None else next(b for b in LOGPROB_BUCKETS if b >= lp)
            key, job = programs.sampler_compile_job(runner, s, st, num_logprobs)
            jobs.setdefault(key, job)
    for r in row_buckets(runner.max_num_seqs):  # copy-on-write page copies (n > 1, beams)
        key, job = programs.copy_compile_job(runner, r)
        jobs.setdefault(key, job)
    images = getattr(runner, "images", None)
    if images is not None:  # vision-language: the encoder per patch bucket, the row gathers
        enc, rows = images.encoder_jobs(runner.params, runner.encoder_examples)
        jobs.update(enc)
        jobs.update(images.place_jobs(sorted({t for _, t, _, _ in shapes}), rows))
    return jobs, sizes


def run_jobs(jobs: dict[tuple, Callable[[], object]], workers: int,
             progress: bool = False) -> None:
    """Run every job on ``workers`` threads (the first error is raised)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc="Compiling", disable=not progress)
    try:
        if workers <= 1:
            for job in jobs.values():
                job()
                bar.update()
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pagedjax-compile") as ex:
            for fut in as_completed([ex.submit(job) for job in jobs.values()]):
                fut.result()
                bar.update()
    finally:
        bar.close()


def warmup(runner, progress: bool = True, shapes=None, workers: int | None = None) -> float:
    """Compile every program of ``runner`` (see the module docstring); seconds taken.
    ``workers``: compiling threads (default ``default_workers()``; 1: in this thread)."""
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    t0 = time.perf_counter()
    run_jobs(compile_jobs(runner, shapes), workers or default_workers(), progress)
    return time.perf_counter() - t0


def start_background(runner, workers: int | None = None, on_done=None):
    """Compile every program of ``runner`` on ``workers`` background threads
    (default ``background_workers()``) while steps run, a first request's first
    (``compile_jobs(order="first_request")``); the runner's steps then wait only
    for a program they need that is not built yet (compile_pool.py). Call before
    the first step, from the thread that runs the steps (the jobs are listed
    there). Sets and returns ``runner.compile_pool``."""
    from pagedjax.worker.compile_pool import CompilePool

    if runner.compile_pool is not None:
        raise RuntimeError("a background warm-up is already running for this runner")
    jobs = compile_jobs(runner, order="first_request")
    runner.compile_pool = CompilePool(jobs, workers or background_workers(), on_done)
    return runner.compile_pool
