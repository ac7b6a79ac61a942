"""A runner's plan: the execution plan its programs are compiled for, the KV pool's
size, and the count of programs XLA compiled (the background and warm-up compiles
report against it).

:func:`make_plan` picks the attention backend's matmul routing (on CPU, which
step sizes run the C++ block kernels); :func:`default_num_pages` sizes the page
pool from a memory budget; :class:`CompileCounter` counts compiles process-wide.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from pagedjax.models.base import ExecutionPlan
from pagedjax.worker import program_store


class CompileCounter:
    """Counts programs obtained from XLA (``count``: compiled or read back from the
    persistent compilation cache or the program store), those read back
    (``cache_hits``) and so those actually compiled (:meth:`compiled`), process-wide."""

    _installed = False
    count = 0
    cache_hits = 0

    @classmethod
    def compiled(cls) -> int:
        """Programs compiled by XLA (not read back from the disk cache) so far."""
        return cls.count - cls.cache_hits

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        cls._installed = True

        def listener(event: str, duration: float, **_: Any) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                cls.count += 1

        def hits(event: str, **_: Any) -> None:
            if event == "/jax/compilation_cache/cache_hits":
                cls.cache_hits += 1

        def loaded(name: str) -> None:  # a whole program from program_store.py
            if name == "loaded":
                cls.count += 1
                cls.cache_hits += 1

        jax.monitoring.register_event_duration_secs_listener(listener)
        jax.monitoring.register_event_listener(hits)
        program_store.listeners.append(loaded)


def make_plan(attn_backend: str, mesh=None, expert_parallel: bool = False,
              kv_layout: tuple | None = None) -> ExecutionPlan:
    """The execution plan of an engine: its backend, matmul routing and mesh.

    On the cpu_native backend, steps of at most ``native_matmul_rows`` tokens
    run their matmuls in the C++ kernel. That limit is measured once per machine
    and kernel build (kernels_pallas/cpu/matmul_rows.py: 32 rows on a 2-core
    Zen 3, 0 on a 2-core AVX-512 Xeon) or set by $PAGEDJAX_NATIVE_MATMUL_ROWS;
    prefill steps stay with XLA."""
    rows = block = 0
    int8 = None
    if attn_backend == "cpu_native" and mesh is None:
        from pagedjax.kernels_pallas.cpu import matmul_rows as cpu_matmul_rows, native as cpu_native

        if cpu_native.fast_matmul():
            rows = cpu_matmul_rows.native_matmul_rows()
        from pagedjax.worker.kernel_limits import quant_kernel_choice

        block = quant_kernel_choice("block", rows)["rows"]
        int8 = quant_kernel_choice("int8", rows)["rows"]
    return ExecutionPlan(attn_backend=attn_backend, native_matmul_rows=rows,
                         block_matmul_rows=block, int8_matmul_rows=int8, mesh=mesh,
                         expert_parallel=expert_parallel and mesh is not None,
                         kv_layout=kv_layout)


def kv_cache_bytes_per_page(info, page_size: int, dtype, layout=None) -> int:
    """Bytes of one page id: its K/V in every array of the pool (one per layer, or
    ``layout.num_slots`` under hybrid KV groups)."""
    layers = info.num_layers if layout is None else layout.num_slots
    return layers * page_size * 2 * info.num_kv_heads * info.head_dim * jnp.dtype(dtype).itemsize


def default_num_pages(info, page_size: int, kv_dtype, max_model_len: int, max_num_seqs: int,
                      budget_bytes: int, layout=None, chunk: int | None = None) -> int:
    """Pages the budget holds (capped at what max_num_seqs full-length sequences use);
    ``layout`` (core/kv_groups.py): a page then holds ``layout.num_slots`` layers."""
    per_page = kv_cache_bytes_per_page(info, page_size, kv_dtype, layout)
    n = budget_bytes // per_page
    if layout is None:
        need = max_num_seqs * math.ceil(max_model_len / page_size)
    else:
        need = max_num_seqs * layout.pages_per_seq(max_model_len, page_size,
                                                   chunk or max_model_len)
    return int(max(2, min(n, need + 1)))
