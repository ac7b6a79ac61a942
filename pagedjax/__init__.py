"""pagedjax: vLLM rebuilt on JAX — paged KV cache, continuous batching, Pallas kernels.

    from pagedjax import LLM, SamplingParams
    llm = LLM()  # SmolLM2-135M-Instruct
    out = llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95))
"""

from __future__ import annotations

__version__ = "0.1.0"

# Before JAX starts its backends: libtpu stays quiet on a machine without a TPU.
from pagedjax.libtpu_env import quiet_libtpu_without_tpu as _quiet_libtpu

_quiet_libtpu()

_LAZY = {
    "LLM": ("pagedjax.entrypoints.llm", "LLM"),
    "AsyncLLM": ("pagedjax.engine.async_llm", "AsyncLLM"),
    "LLMEngine": ("pagedjax.engine.llm_engine", "LLMEngine"),
    "EngineArgs": ("pagedjax.config", "EngineArgs"),
    "SamplingParams": ("pagedjax.sampling_params", "SamplingParams"),
    "BeamSearchParams": ("pagedjax.sampling_params", "BeamSearchParams"),
    "RequestOutputKind": ("pagedjax.sampling_params", "RequestOutputKind"),
    "StructuredOutputsParams": ("pagedjax.sampling_params", "StructuredOutputsParams"),
    "RequestOutput": ("pagedjax.outputs", "RequestOutput"),
    "CompletionOutput": ("pagedjax.outputs", "CompletionOutput"),
    "Logprob": ("pagedjax.outputs", "Logprob"),
    "BeamSearchOutput": ("pagedjax.outputs", "BeamSearchOutput"),
    "LoRARequest": ("pagedjax.lora.request", "LoRARequest"),
}

__all__ = list(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'pagedjax' has no attribute {name!r}")
