"""Ragged paged-attention kernels behind one entry point.

``ragged_paged_attention(..., backend=...)`` dispatches to:
  - ``cpu_native``: a C++ kernel called through XLA's FFI (``cpu_native.py``,
    built on first use with the system compiler), what ``auto`` picks on CPU;
  - ``xla``: the pure-jnp reference (``reference.py``), runs anywhere; ``auto``
    on CPU when the C++ kernel cannot be built;
  - ``pallas_gpu``: a Pallas kernel lowered through Triton (``triton_gpu.py``);
  - ``pallas_tpu``: a Pallas kernel lowered through Mosaic (``mosaic_tpu.py``).
``auto`` picks by ``jax.default_backend()``. On CPU the Pallas backends run in
interpret mode. ``sharded_attention(mesh)`` runs any of them per device under
tensor parallelism (``sharded.py``).

JAX versions: the kernels are tested with the range pinned in pyproject.toml.
JAX 0.11 deprecates the Pallas Triton lowering; on a JAX without it ``auto``
on a GPU falls back to ``xla`` with one warning, and an explicit
``pallas_gpu`` raises a ValueError that says so.
"""

from __future__ import annotations

import functools
import importlib
import warnings

import jax
import numpy as np

from pagedjax.kernels_pallas.kv_write import (  # noqa: F401
    KV_CACHE_DTYPES,
    allocate_kv_pages,
    copy_pages,
    is_quantized,
    write_kv,
)
from pagedjax.kernels_pallas.reference import check_args
from pagedjax.kernels_pallas.reference import ragged_paged_attention as reference_attention
from pagedjax.kernels_pallas.sharded import sharded_attention  # noqa: F401

BACKENDS = ("auto", "xla", "cpu_native", "pallas_gpu", "pallas_tpu")


@functools.lru_cache(maxsize=None)
def triton_lowering_missing() -> str | None:
    """None when this JAX has the Pallas Triton lowering, else why not."""
    try:
        importlib.import_module("jax.experimental.pallas.triton")
    except Exception as e:  # noqa: BLE001 - removed or broken in this JAX
        return (f"this JAX ({jax.__version__}) has no Pallas Triton lowering "
                f"(jax.experimental.pallas.triton: {type(e).__name__}: {e})")
    return None


def resolve_backend(backend: str = "auto") -> str:
    """Map ``auto`` to a concrete backend for the current platform."""
    if backend not in BACKENDS:
        raise ValueError(f"attention_backend: {backend!r} is not one of {BACKENDS}")
    platform = jax.default_backend()
    if backend == "pallas_gpu" and triton_lowering_missing():
        raise ValueError(f"attention_backend='pallas_gpu': {triton_lowering_missing()}; "
                         "install a JAX in the range pyproject.toml pins, or use 'xla'")
    if backend == "cpu_native":
        from pagedjax.kernels_pallas.cpu import native as cpu_native

        if platform != "cpu":
            raise ValueError(f"attention_backend='cpu_native' runs on the CPU platform, "
                             f"this process runs on {platform!r}; use 'auto'")
        if not cpu_native.available():
            raise ValueError(f"attention_backend='cpu_native' is unavailable: "
                             f"{cpu_native.unavailable_reason()}; use 'xla'")
        return backend
    if backend != "auto":
        return backend
    if platform == "gpu":
        if triton_lowering_missing():
            warnings.warn(f"{triton_lowering_missing()}; attention falls back to the 'xla' "
                          "backend (slower). Install a JAX in the range pyproject.toml pins "
                          "for the Pallas GPU kernel", RuntimeWarning, stacklevel=2)
            return "xla"
        return "pallas_gpu"
    if platform == "tpu":
        return "pallas_tpu"
    from pagedjax.kernels_pallas.cpu import native as cpu_native

    return "cpu_native" if platform == "cpu" and cpu_native.available() else "xla"


def _check_page_table_width(kv_pages, kv_lens, page_table, num_seqs, max_q_len) -> None:
    """page_table must cover each context; checked where the values are known."""
    page_size = kv_pages.shape[3]
    cap = page_table.shape[1] * page_size
    if max_q_len is not None and max_q_len > cap:
        raise ValueError(
            f"page_table: {page_table.shape[1]} pages of {page_size} tokens cannot hold "
            f"max_q_len={max_q_len} new tokens")
    try:  # concrete (not traced) lengths: check them all
        lens = np.asarray(kv_lens)
        n = int(np.reshape(np.asarray(num_seqs), ()))
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    if n > 0 and lens[:n].max(initial=0) > cap:
        raise ValueError(
            f"page_table: {page_table.shape[1]} pages of {page_size} tokens per sequence, "
            f"but kv_lens has a context of {int(lens[:n].max())}")


def ragged_paged_attention(
    q,
    kv_pages,
    kv_lens,
    page_table,
    cu_q_lens,
    num_seqs,
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    kv_scales=None,
    max_q_len: int | None = None,
    backend: str = "auto",
    interpret: bool | None = None,
):
    """See ``reference.py`` for the contract. ``interpret=None`` means: interpret
    the Pallas kernels when the platform cannot run them natively."""
    backend = resolve_backend(backend)
    check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    _check_page_table_width(kv_pages, kv_lens, page_table, num_seqs, max_q_len)
    kw = dict(sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
              kv_scales=kv_scales, max_q_len=max_q_len)
    if backend == "xla":
        return reference_attention(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, **kw)
    if backend == "cpu_native":
        from pagedjax.kernels_pallas.cpu import native as cpu_native

        return cpu_native.ragged_paged_attention(
            q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, **kw)
    if backend == "pallas_gpu":
        from pagedjax.kernels_pallas.pallas import triton_gpu

        if interpret is None:
            interpret = jax.default_backend() != "gpu"
        return triton_gpu.ragged_paged_attention(
            q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, interpret=interpret, **kw
        )
    from pagedjax.kernels_pallas.pallas import mosaic_tpu

    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    return mosaic_tpu.ragged_paged_attention(
        q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, interpret=interpret, **kw
    )
