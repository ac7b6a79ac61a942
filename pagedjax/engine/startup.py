"""What an engine does once per start, called by :class:`pagedjax.engine.llm_engine.LLMEngine`:
the persistent compilation cache, the C++ builds started early (beside the model's
loading), the settings resolved against the model and the devices, and the heap
start-up left moved out of the garbage collector's sight.
"""

from __future__ import annotations

import gc
import logging
import sys
import time

import jax

from pagedjax.config import EngineArgs, EngineConfig
from pagedjax.worker.plan import CompileCounter, default_num_pages

logger = logging.getLogger("pagedjax.startup")


def phase_logger() -> logging.Logger:
    """The logger of the start's phase lines (load, compile, ready). Where the
    application configured no logging at all, it writes INFO lines to stderr
    itself (as the server does once it configures logging), so a notebook's
    ``LLM()`` shows them too."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("pagedjax: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def _programs_since(mark: tuple[int, int]) -> str:
    compiled = CompileCounter.compiled() - (mark[0] - mark[1])
    read = CompileCounter.cache_hits - mark[1]
    return f"{compiled} compiled, {read} read back from the cache"


def compile_programs(runner, args: EngineArgs, started: float) -> None:
    """The compile phase, then the ready line: every program now
    (``compile_all_at_start``), on background threads while requests are served
    (``background_compile``: ``Runner.start_background_warmup``), or each on
    first use (neither)."""
    log = phase_logger()
    mark = (CompileCounter.count, CompileCounter.cache_hits)
    if args.compile_all_at_start:
        secs = runner.warmup(progress=False)
        log.info("compile: %.1f s, every program (%s)", secs, _programs_since(mark))
    elif args.background_compile:
        def done(pool) -> None:
            log.info("compile: %.1f s in the background, %d of %d programs (%d built ahead of "
                     "the queue by a step that needed them, %d failed, %d cancelled; in all %s)",
                     pool.seconds, pool.total - pool.cancelled, pool.total,
                     pool.compiled_in_step, len(pool.failed), pool.cancelled,
                     _programs_since(mark))

        pool = runner.start_background_warmup(on_done=done)
        log.info("compile: %d programs on %d background thread(s); requests are served "
                 "meanwhile", pool.total, len(pool.threads))
    log.info("ready: %.1f s after start", time.perf_counter() - started)


def enable_compilation_cache(path: str | None) -> str | None:
    """Persist every compiled XLA program so that the next start compiles none
    (``compile_cache.py`` says where and under which keys); the folder used."""
    from pagedjax.engine import compile_cache

    return compile_cache.enable(path)


def freeze_startup_heap() -> None:
    """Move what start-up left on the heap (modules, the model, the tokenizer: some
    400k objects) out of the cyclic garbage collector's sight, as vLLM does after
    start-up. Without it, every full collection scans them all: 5-7 ms per step
    on average at 256 decode rows (host_overhead.py). Once per process, and never over
    a freeze the application made itself (``gc.get_freeze_count()`` > 0); frozen
    objects are still freed by reference counting."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


def slow_dtype_warning(dtype, platform: str) -> str | None:
    """Why a 16-bit model dtype on the CPU is a poor choice, or None: XLA:CPU runs
    bfloat16 / float16 matmuls far slower than float32, and writes new keys and values
    into a bfloat16 KV pool by copying the whole pool (compare `pagedjax generate
    --dtype bfloat16` with the default). The model dtype `auto` is float32 there;
    kv_cache_dtype="float16" halves the pool on its own."""
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)
    if platform != "cpu" or dt.itemsize != 2 or not jnp.issubdtype(dt, jnp.floating):
        return None
    return (f"dtype={dt.name} on the CPU runs far slower than float32 (XLA:CPU's 16-bit "
            f"matmuls and KV-pool writes); use dtype='auto' (float32 here), and "
            f"kv_cache_dtype='float16' for a KV pool of half the bytes")


def start_cpu_builds(args: EngineArgs) -> None:
    """On the CPU platform, build the C++ sampler and KV-pool zeroing (and the C++ attention, matmul and
    GGUF block kernels, when the attention backend may use them) on background threads
    while the model loads: on a first start the two compilers then run beside
    the loading instead of after it. Found in the cache, this costs nothing."""
    if jax.default_backend() != "cpu":
        return
    from pagedjax.kernels_pallas.cpu import (blockmatmul as cpu_blockmatmul, native as cpu_native,
                                             sampler as cpu_sampler, zero_pages)

    cpu_sampler.load_in_background()
    zero_pages.load_in_background()  # the KV pool, zeroed without writing it
    if args.attention_backend in ("auto", "cpu_native") and args.tensor_parallel_size == 1:
        cpu_native.load_in_background()
        if args.quantization in (None, "gguf", "awq", "gptq"):  # blocks or int4 groups kept
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
    layout = kv_layout(info, args)
    num_pages = args.num_pages
    if num_pages is None:
        budget = int(args.cpu_kv_cache_gib * 2**30)
        if jax.default_backend() != "cpu":
            stats = jax.devices()[0].memory_stats() or {}
            if stats.get("bytes_limit"):
                budget = (int(stats["bytes_limit"] * args.gpu_memory_utilization)
                          - stats.get("bytes_in_use", 0))
        num_pages = default_num_pages(info, args.page_size, kv_dtype, max_model_len,
                                      args.max_num_seqs, budget, layout, mnbt)
    # `auto` under tensor parallelism on CPU is `xla` (GSPMD partitions it; the C++
    # kernels would need shard_map too); elsewhere the platform's kernel, per device
    # through shard_map under TP.
    if args.attention_backend == "auto" and mesh is not None and jax.default_backend() == "cpu":
        backend = "xla"
    else:
        backend = resolve_backend(args.attention_backend)
    if args.kv_cache_dtype == "float16" and backend not in ("cpu_native", "xla"):
        raise ValueError(f"kv_cache_dtype='float16' is read by the CPU kernel and the 'xla' "
                         f"backend, not by attention_backend={backend!r}; use 'auto' (the "
                         f"model's dtype), 'int8' or 'fp8'")
    return EngineConfig(args=args, max_model_len=max_model_len, max_num_batched_tokens=mnbt,
                        num_pages=num_pages, attention_backend=backend, kv_cache_dtype=kv_dtype,
                        kv_layout=layout)


def kv_layout(info, args: EngineArgs):
    """The KV groups of the model's layers (core/kv_groups.py): by attention type unless
    --disable-hybrid-kv-cache-manager, or a draft model that reads group 0's table
    would meet a sliding group there."""
    from pagedjax.core.kv_groups import plan_layout

    windows = info.layer_windows or (None,) * info.num_layers
    hybrid = not args.disable_hybrid_kv_cache_manager
    layout = plan_layout(windows, hybrid)
    draft = False
    if args.speculative_config is not None:
        from pagedjax.spec_decode.config import parse_speculative_config

        draft = parse_speculative_config(args.speculative_config).method == "draft_model"
    if draft and layout.groups[0].window is not None:
        layout = plan_layout(windows, False)
    return layout


def weight_quantization(args, resolved) -> str | None:
    """The weights' quantization (models.load_model's argument) for ``args``.

    ``args.quantization`` when set ("none": float weights, GGUF blocks and published
    quantized checkpoints dequantized at load). Unset: a published FP8 / AWQ / GPTQ
    checkpoint keeps its quantization (its method); a GGUF file on the CPU (one
    device, the C++ backend) keeps its blocks ("gguf", multiplied by the C++ block
    kernel) where that kernel beats float32 weights and is nowhere slower (within
    5%) on this machine (measured once, worker.kernel_limits.quant_kernel_choice), else float
    weights. The engine logs which."""
    q = args.quantization
    if q is not None:
        return q
    if resolved.gguf_file is None:  # a published FP8 / AWQ / GPTQ checkpoint keeps its own
        from pagedjax.models import checkpoint_quant

        sch = checkpoint_quant.scheme(resolved.hf_config or {})
        return sch.method if sch else None
    if (args.tensor_parallel_size > 1 or jax.default_backend() != "cpu"
            or args.attention_backend not in ("auto", "cpu_native")):
        return None
    from pagedjax.kernels_pallas.cpu import quant_rows
    from pagedjax.worker.kernel_limits import quant_kernel_choice

    choice = quant_kernel_choice("block")
    if choice["default"]:
        logger.info("GGUF weights kept in their blocks: the C++ block kernel beats float32 "
                    "weights here and is within %d%% of them at every row count "
                    "(quantization='none' dequantizes at load)",
                    round(100 * (quant_rows.TIE - 1)))
        return "gguf"
    logger.info("GGUF weights dequantized to float at load: the C++ block kernel %s "
                "(quantization='gguf' keeps the blocks)",
                "is slower than float32 weights at some row count, or nowhere faster, here"
                if choice["rows"]
                else "is not available")
    return None
