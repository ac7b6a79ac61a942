"""Engine configuration: one frozen dataclass per concern, plus EngineArgs (user-facing)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """The KV page pool."""

    page_size: int = 16
    num_pages: int | None = None  # None: derived from memory budget
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_gib: float = 2.0  # pool budget on CPU when num_pages is None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = False


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    policy: str = "fcfs"


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclasses.dataclass
class EngineArgs:
    """Everything ``LLM(...)`` and ``pagedjax serve`` accept.

    Args:
        model: the default model's short name ("SmolLM2-135M-Instruct"), an HF
            model folder, or a ``.gguf`` file. None means the default model.
        tokenizer: a tokenizer folder when it differs from the model's.
        dtype: "auto" (float32 on CPU, bfloat16 on accelerators), "float32", "bfloat16".
        max_model_len: longest prompt + output; defaults to min(model limit, 2048).
        num_pages: pages in the KV pool; default from ``gpu_memory_utilization``
            (accelerators) or ``cpu_kv_cache_gib`` (CPU).
        page_size: tokens per KV page.
        max_num_seqs: most sequences in one step.
        max_num_batched_tokens: most tokens in one step (chunked prefill budget).
        enable_prefix_caching: reuse KV pages of identical prompt prefixes.
        seed: engine seed for unseeded random sampling.
        attention_backend: "auto", "xla", "cpu_native", "pallas_gpu", "pallas_tpu".
        kv_cache_dtype: "auto" (model dtype), "int8", "fp8".
        tensor_parallel_size: devices to shard the model over.
        enforce_eager: skip compile-ahead warm-up (shapes compile on first use).
        scan_layers: run identical layers with ``lax.scan`` (several times faster
            compiles, but slower steps on CPU because the scanned KV pool
            update is not in place, so it is off by default); used when the
            model supports it and tensor_parallel_size == 1.
        async_scheduling: overlap each step's host work (scheduling, input
            padding, detokenization) with the previous step on the device;
            the same outputs as False, which runs steps serially (debugging).
    """

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    num_pages: int | None = None
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_gib: float = 2.0
    page_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = False
    seed: int = 0
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    scheduling_policy: str = "fcfs"
    enforce_eager: bool = False
    scan_layers: bool = False
    compilation_cache_dir: str | None = None
    async_scheduling: bool = True

    def validate(self) -> None:
        def positive(name: str, value: Any) -> None:
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        for name in ("max_model_len", "num_pages", "page_size", "max_num_seqs",
                     "max_num_batched_tokens", "tensor_parallel_size"):
            positive(name, getattr(self, name))
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two (e.g. 16), got {self.page_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.kv_cache_dtype not in ("auto", "int8", "fp8", "fp8_e4m3"):
            raise ValueError(f"kv_cache_dtype must be auto, int8 or fp8, got {self.kv_cache_dtype!r}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}"
            )
        if self.attention_backend not in ("auto", "xla", "cpu_native", "pallas_gpu", "pallas_tpu"):
            raise ValueError(
                "attention_backend must be one of auto, xla, cpu_native, pallas_gpu, pallas_tpu, "
                f"got {self.attention_backend!r}"
            )


def default_cache_dir() -> str:
    base = os.environ.get("PAGEDJAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedjax"
    )
    return base
