"""Compile jobs: each program a runner's steps can run, compiled without running it.

Each function returns ``(key, job)``: ``job()`` lowers and compiles one of the
runner's jitted programs (the model step per shape bucket, the sampler per row
bucket and feature flags, the page copy) for the shapes given, and the runner's
later calls reuse the compiled program. Warm-up (``warmup.py``), its background
pool (``compile_pool.py``) and the device-less AOT check (``aot.py``) run them.
The host-side padding happens in the caller's thread, so jobs are thread-safe.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.sample import sampler as sampler_mod
from pagedjax.worker.inputs import SampleRow, pow2
from pagedjax.worker.packing import pack


def model_compile_job(runner, rows, sample_rows: Sequence[SampleRow]):
    """(key, job) for the model program a step of ``rows`` runs: ``job()``
    compiles it without running it (thread-safe: the host-side padding is
    done here, in the caller's thread) and the jitted step then reuses it."""
    batch, st, sample_index, num_logprobs, prompt_k, shape = runner.prepare(
        rows, sample_rows, {}, {}, None, None)
    bbufs, bspec = pack(batch)
    args = (runner.param_args, runner.kv_caches, bbufs, runner.no_tokens)
    if runner.images is not None:  # as the runner's step passes them
        args += (runner.images.step_inputs((), len(batch.token_ids)),)
    kw = dict(spec=bspec, plan=runner.plan, prompt_k=prompt_k)
    return ("model", bspec, prompt_k), lambda: runner.step_program.compile(*args, **kw)


def sampler_compile_job(runner, num_logits: int, st, num_logprobs):
    """(key, job) for the sampler program of ``num_logits`` logits rows and the
    sampling rows ``st`` (len(st.greedy) of them); see ``model_compile_job``."""
    backend = runner.sample_backend
    st = sampler_mod.program_flags(st, backend)
    rows = len(st.greedy)
    sbufs, sspec = pack((st, np.zeros(rows, np.int32)))
    logits = jax.ShapeDtypeStruct((num_logits, runner.vocab_size), jnp.float32,
                                  sharding=runner.logits_sharding)
    key = ("sampler", num_logits, sspec, num_logprobs)
    return key, lambda: runner.sampler_program.compile(logits, sbufs, spec=sspec,
                                                       num_logprobs=num_logprobs,
                                                       backend=backend)


def copy_compile_job(runner, num_copies: int):
    """(key, job) for the page-copy program of up to ``num_copies`` copies."""
    n = pow2(num_copies, 8)
    idx = np.zeros(n, np.int32)
    return ("copy", n), lambda: runner.copy_program.compile(runner.kv_caches, idx, idx)
