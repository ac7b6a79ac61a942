"""Engine settings: one source of truth.

:class:`EngineArgs` is what ``LLM(...)``, ``AsyncLLM(...)`` and ``pagedjax
serve|generate`` accept. Each field declares its command-line flag, help and
choices here; :meth:`EngineArgs.add_cli_args` builds the flags from them and
:meth:`EngineArgs.validate` checks the same choices. At start-up the engine
resolves the arguments once into a frozen :class:`EngineConfig` (computed
``max_model_len``, ``max_num_batched_tokens``, ``num_pages``, attention
backend), which is what the rest of the engine reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

BACKENDS = ("auto", "xla", "cpu_native", "pallas_gpu", "pallas_tpu")
# kv_cache_dtype: auto (the model's dtype), or a name of kernels_pallas.KV_CACHE_DTYPES
KV_CACHE_DTYPE_CHOICES = ("auto", "float16", "int8", "fp8", "fp8_e4m3")


def _opt(default: Any, help: str, choices: tuple | None = None, flag: str | None = None,
         short: str | None = None, cli: bool = True):
    meta = dict(help=help, choices=choices, flag=flag, short=short, cli=cli)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass
class EngineArgs:
    """Everything ``LLM(...)`` and ``pagedjax serve`` accept (see each field's help)."""

    model: str | None = _opt(None, "short name (SmolLM2-135M-Instruct, the default), HF "
                                   "folder, .gguf file or hub id (org/name)", cli=False)
    tokenizer: str | None = _opt(None, "tokenizer folder when it differs from the model's")
    revision: str | None = _opt(None, "hub model: branch, tag or commit (default: main)")
    download_dir: str | None = _opt(None, "hub model: folder to download into instead of the "
                                          "Hugging Face cache")
    generation_config: str = _opt("auto", "default sampling values of requests that set none: "
                                          "auto = the model's generation_config.json, vllm = "
                                          "off, or a folder holding a generation_config.json")
    dtype: str = _opt("auto", "weights and activations: auto = float32 on CPU, bfloat16 on "
                              "accelerators", ("auto", "float32", "bfloat16", "float16"))
    max_model_len: int | None = _opt(None, "longest prompt + output; default min(model "
                                           "limit, 2048)")
    num_pages: int | None = _opt(None, "KV pool pages; default from --gpu-memory-utilization "
                                       "(accelerators) or --cpu-kv-cache-gib (CPU)")
    gpu_memory_utilization: float = _opt(0.9, "fraction of accelerator memory for weights + "
                                              "KV pool")
    cpu_kv_cache_gib: float = _opt(2.0, "KV pool budget on CPU when --num-pages is not given")
    page_size: int = _opt(16, "tokens per KV page (a power of two)")
    max_num_seqs: int = _opt(64, "most sequences in one step")
    max_num_batched_tokens: int | None = _opt(None, "most tokens in one step (chunked-prefill "
                                                    "budget); default max(512, min(2048, "
                                                    "max_num_seqs))")
    enable_prefix_caching: bool = _opt(True, "reuse the KV pages of identical prompt prefixes "
                                             "(automatic prefix caching, on as in vLLM V1)")
    disable_hybrid_kv_cache_manager: bool = _opt(
        False, "give every layer pages for the whole context, sliding-window layers too "
               "(default: hybrid-attention models keep only each window's pages)")
    seed: int = _opt(0, "engine seed for unseeded random sampling")
    attention_backend: str = _opt("auto", "paged-attention kernel", BACKENDS)
    kv_cache_dtype: str = _opt("auto", "KV pool dtype (auto = the model's; float16: half "
                                       "the pool's bytes, the CPU kernel widens it in "
                                       "registers, llama.cpp's default cache type)",
                               KV_CACHE_DTYPE_CHOICES)
    quantization: str | None = _opt(None, "weights kept quantized on the device, dequantized "
                                          "in each step: int8 (per channel, any checkpoint) or "
                                          "gguf (a .gguf file's Q8_0/Q4_0/Q4_1/Q4_K/Q6_K "
                                          "blocks); fp8, awq, gptq, compressed-tensors: a "
                                          "published checkpoint's own (docs/quantization.md); "
                                          "none: float weights; default: the checkpoint's "
                                          "quantization_config, gguf for "
                                          "a .gguf file on the CPU where the C++ block kernel "
                                          "is faster here, else float weights",
                                    (None, "none", "int8", "gguf", "fp8", "awq", "gptq",
                                     "compressed-tensors"))
    tensor_parallel_size: int = _opt(1, "devices to shard the model over", short="-tp")
    enable_expert_parallel: bool = _opt(False, "mixture-of-experts models: shard the experts "
                                               "over the tensor-parallel devices (whole experts "
                                               "per device) instead of splitting each expert")
    scheduling_policy: str = _opt("fcfs", "waiting-queue order", ("fcfs", "priority"))
    scan_layers: bool = _opt(False, "run identical layers with lax.scan (faster compiles, "
                                    "slower CPU steps)")
    compilation_cache_dir: str | None = _opt(None, "persistent XLA cache folder (default "
                                                   "~/.cache/pagedjax/xla)")
    compile_all_at_start: bool = _opt(False, "compile every program a step can run before the "
                                             "engine takes requests (pay the whole warm-up up "
                                             "front; no compilation inside any step)")
    background_compile: bool = _opt(False, "compile every program a step can run on background "
                                           "threads while requests are served: a step waits "
                                           "only for a program it needs that is not built yet "
                                           "(`pagedjax serve` turns it on)")
    async_scheduling: bool = _opt(True, "overlap each step's host work with the previous "
                                        "device step (same outputs; off for debugging)")
    enable_lora: bool = _opt(False, "serve LoRA adapters (PEFT folders) on top of the model, "
                                    "mixed in one batch (docs/lora.md)")
    max_loras: int = _opt(1, "LoRA adapters held on the device at once (slots)")
    max_lora_rank: int = _opt(16, "largest LoRA rank served")
    max_cpu_loras: int | None = _opt(None, "LoRA adapters cached in host memory "
                                           "(default: max_loras)")
    speculative_config: dict | str | None = _opt(
        None, 'speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, '
              '"prompt_lookup_max": 4, "prompt_lookup_min": 1} or a draft model sharing the '
              'tokenizer {"model": PATH, "num_speculative_tokens": 4} (steps then run serially; '
              'docs/speculative_decoding.md)')
    limit_mm_per_prompt: dict | str | None = _opt(
        None, 'most images per prompt, as JSON: {"image": 4} (vision-language models; '
              'default: no limit; docs/multimodal.md)')
    max_image_pixels: int = _opt(4096 * 4096, "largest image accepted (width x height)")
    encoder_cache_size: int = _opt(8192, "vision-encoder output rows kept for images no "
                                         "running request holds (repeats hit the cache)")
    allowed_media_domains: str | None = _opt(
        None, "comma-separated host names the server may fetch image_url http(s) URLs from "
              "(default: none; data: URLs always work)")
    allowed_local_media_path: str | None = _opt(
        None, "folder whose files image_url file:// URLs may name (default: none)")
    media_fetch_timeout: float = _opt(10.0, "seconds to fetch one image_url")
    max_media_bytes: int = _opt(20 * 2**20, "largest image_url download, in bytes")

    def validate(self) -> None:
        self._check_types()

        def positive(name: str, value: Any) -> None:
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {str(value)[:60]!r}")

        for name in ("max_model_len", "num_pages", "page_size", "max_num_seqs",
                     "max_num_batched_tokens", "tensor_parallel_size", "max_loras",
                     "max_lora_rank", "max_cpu_loras", "max_image_pixels", "max_media_bytes"):
            positive(name, getattr(self, name))
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two (e.g. 16), got {self.page_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not self.cpu_kv_cache_gib > 0:
            raise ValueError(f"cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")
        for name in ("compile_all_at_start", "background_compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        from pagedjax.spec_decode.config import parse_speculative_config

        parse_speculative_config(self.speculative_config)  # raises ValueError naming the key
        from pagedjax.core.mm_limits import parse_limits

        parse_limits(self.limit_mm_per_prompt)  # raises ValueError naming the modality
        if not isinstance(self.encoder_cache_size, int) or self.encoder_cache_size < 0:
            raise ValueError(f"encoder_cache_size must be an integer >= 0, "
                             f"got {self.encoder_cache_size!r}")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                allowed = ", ".join(map(repr, choices))
                raise ValueError(f"{f.name} must be one of {allowed}, got {value!r}")

    def _check_types(self) -> None:
        """Paths, numbers and switches of the wrong type (a TypeError that is also a
        ValueError, naming the argument)."""
        from pagedjax.arguments import ArgumentTypeError, short

        for name in ("model", "tokenizer", "compilation_cache_dir"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (str, os.PathLike)):
                raise ArgumentTypeError(f"{name} must be a path or model name (str), got "
                                        f"{type(v).__name__} {short(v)}")
        for name in ("gpu_memory_utilization", "cpu_kv_cache_gib"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ArgumentTypeError(f"{name} must be a number, got {short(v)}")
        for name in ("enable_prefix_caching", "scan_layers", "async_scheduling", "enable_lora",
                     "disable_hybrid_kv_cache_manager"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentTypeError(f"{name} must be True or False, got "
                                        f"{short(getattr(self, name))}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ArgumentTypeError(f"seed must be an integer, got {short(self.seed)}")

    # ------------------------------------------------------------------ command line
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """One ``--flag`` per field (booleans: ``--x`` / ``--no-x``)."""
        for f in dataclasses.fields(cls):
            m = f.metadata
            if not m.get("cli", True):
                continue
            flag = m.get("flag") or "--" + f.name.replace("_", "-")
            names = [flag] + ([m["short"]] if m.get("short") else [])
            if f.type in ("bool", bool):
                parser.add_argument(*names, dest=f.name, default=f.default,
                                    action=argparse.BooleanOptionalAction, help=m["help"])
                continue
            kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0], str)
            parser.add_argument(*names, dest=f.name, type=kind, default=f.default,
                                choices=m.get("choices"), help=m["help"])

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace, **overrides: Any) -> "EngineArgs":
        kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
        kw.update(overrides)
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """EngineArgs resolved once at start-up (what the engine actually runs with)."""

    args: EngineArgs
    max_model_len: int
    max_num_batched_tokens: int
    num_pages: int
    attention_backend: str  # concrete, never "auto"
    kv_cache_dtype: Any  # a jnp dtype
    kv_layout: Any = None  # core.kv_groups.KVLayout: the KV groups of the model's layers


def default_cache_dir() -> str:
    base = os.environ.get("PAGEDJAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedjax"
    )
    return base
