"""A fresh trace of a runner's decode step, for tests that count what its kernels see."""

from __future__ import annotations

import jax

from pagedjax import SamplingParams


def trace_decode_step(runner, rows: int = 1) -> None:
    """Lower (trace, not run) the model part of a decode step of ``rows`` dummy rows."""
    from pagedjax.sample.sampler import RowState
    from pagedjax.worker import warmup
    from pagedjax.worker.inputs import SampleRow
    from pagedjax.worker.packing import pack

    scheduled = warmup.dummy_rows(runner.buckets, rows, rows, 1, True)
    srows = [SampleRow(r.request_id, i, RowState(SamplingParams(temperature=0.0), [0], []), None)
             for i, r in enumerate(scheduled)]
    batch = runner.prepare(scheduled, srows, {}, {}, None, None)[0]
    bufs, spec = pack(batch)
    step = jax.jit(lambda *a, **k: runner._step_impl(*a, **k),  # (a fresh trace)
                   static_argnames=("spec", "plan", "prompt_k"))
    step.lower(runner.param_args, runner.kv_caches, bufs, runner.no_tokens, spec=spec,
               plan=runner.plan, prompt_k=None)
