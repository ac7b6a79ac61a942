"""What an engine does once per start, called by :class:`pagedjax.engine.llm_engine.LLMEngine`:
the persistent compilation cache, the C++ builds started early (beside the model's
loading), the settings resolved against the model and the devices, and the heap
start-up left moved out of the garbage collector's sight.
"""

from __future__ import annotations

import gc
import logging

import jax

from pagedjax.config import EngineArgs, EngineConfig, default_cache_dir
from pagedjax.worker.runner import default_num_pages

logger = logging.getLogger("pagedjax.engine.startup")


def enable_compilation_cache(path: str | None) -> None:
    """Persist compiled XLA programs so the next start-up skips most compiles."""
    try:
        cache = path or f"{default_cache_dir()}/xla"
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except Exception:  # noqa: BLE001 - an old jax without these flags: run uncached
        pass


def freeze_startup_heap() -> None:
    """Move what start-up left on the heap (modules, the model, the tokenizer: some
    400k objects) out of the cyclic garbage collector's sight, as vLLM does after
    start-up. Without it, every full collection scans them all: 5-7 ms per step
    on average at 256 decode rows (BENCHMARKS.md). Once per process, and never over
    a freeze the application made itself (``gc.get_freeze_count()`` > 0); frozen
    objects are still freed by reference counting."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


def start_cpu_builds(args: EngineArgs) -> None:
    """On the CPU platform, build the C++ sampler (and the C++ attention, matmul and
    GGUF block kernels, when the attention backend may use them) on background threads
    while the model loads: on a first start the two compilers then run beside
    the loading instead of after it. Found in the cache, this costs nothing."""
    if jax.default_backend() != "cpu":
        return
    from pagedjax.kernels_pallas.cpu import (blockmatmul as cpu_blockmatmul, native as cpu_native,
                                             sampler as cpu_sampler)

    cpu_sampler.load_in_background()
    if args.attention_backend in ("auto", "cpu_native") and args.tensor_parallel_size == 1:
        cpu_native.load_in_background()
        if args.quantization in (None, "gguf"):  # GGUF blocks may stay quantized
            cpu_blockmatmul.load_in_background()


def resolve_config(args: EngineArgs, info, mesh) -> EngineConfig:
    """EngineArgs resolved once against the model and the devices."""
    from pagedjax.kernels_pallas import KV_CACHE_DTYPES, resolve_backend

    max_model_len = args.max_model_len or min(info.max_model_len, 2048)
    if max_model_len > info.max_model_len:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's limit "
                         f"{info.max_model_len}; lower max_model_len")
    mnbt = args.max_num_batched_tokens or max(512, min(2048, args.max_num_seqs))
    kv_dtype = info.dtype if args.kv_cache_dtype == "auto" else KV_CACHE_DTYPES[args.kv_cache_dtype]
    num_pages = args.num_pages
    if num_pages is None:
        budget = int(args.cpu_kv_cache_gib * 2**30)
        if jax.default_backend() != "cpu":
            stats = jax.devices()[0].memory_stats() or {}
            if stats.get("bytes_limit"):
                budget = (int(stats["bytes_limit"] * args.gpu_memory_utilization)
                          - stats.get("bytes_in_use", 0))
        num_pages = default_num_pages(info, args.page_size, kv_dtype, max_model_len,
                                      args.max_num_seqs, budget)
    # `auto` under tensor parallelism on CPU is `xla` (GSPMD partitions it; the C++
    # kernels would need shard_map too); elsewhere the platform's kernel, per device
    # through shard_map under TP.
    if args.attention_backend == "auto" and mesh is not None and jax.default_backend() == "cpu":
        backend = "xla"
    else:
        backend = resolve_backend(args.attention_backend)
    return EngineConfig(args=args, max_model_len=max_model_len, max_num_batched_tokens=mnbt,
                        num_pages=num_pages, attention_backend=backend, kv_cache_dtype=kv_dtype)


def weight_quantization(args, resolved) -> str | None:
    """The weights' quantization (models.load_model's argument) for ``args``.

    ``args.quantization`` when set ("none": float weights, GGUF blocks dequantized at
    load). Unset: a GGUF file on the CPU (one device, the C++ backend) keeps its blocks
    ("gguf", multiplied by the C++ block kernel) where that kernel beats float32
    weights at every row count on this machine (measured once,
    worker.runner.quant_kernel_choice),
    else float weights. The engine logs which."""
    q = args.quantization
    if q is not None:
        return None if q == "none" else q
    if (resolved.gguf_file is None or args.tensor_parallel_size > 1
            or jax.default_backend() != "cpu"
            or args.attention_backend not in ("auto", "cpu_native")):
        return None
    from pagedjax.worker.kernel_limits import quant_kernel_choice

    choice = quant_kernel_choice("block")
    if choice["default"]:
        logger.info("GGUF weights kept in their blocks: the C++ block kernel beats float32 "
                    "weights at every row count here (steps of up to %d rows; "
                    "quantization='none' dequantizes at load)", choice["rows"])
        return "gguf"
    logger.info("GGUF weights dequantized to float at load: the C++ block kernel %s "
                "(quantization='gguf' keeps the blocks)",
                "does not beat float32 weights at every row count here" if choice["rows"]
                else "is not available")
    return None
