"""The shared skeleton of a causal LM: config parsing, KV allocation, the LM head.

Each architecture subclasses :class:`CausalLM` and provides

    __init__(config: dict, dtype, eos_token_ids)   parse the HF config (dict)
    forward(params, kv_caches, token_ids, meta, plan) -> (hidden [T, H], kv_caches)
    params_from_hf(get)                             HF tensor names -> numpy params

``get(name)`` returns the HF checkpoint tensor ``name`` as a numpy array
(PyTorch layouts: Linear weights are [out, in]). The loader casts the numpy
tree to jnp arrays of the requested dtype.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import kernels_pallas
from models import layers as L
from models.base import DEFAULT_PLAN, ExecutionPlan, ModelInfo

GetTensor = Callable[[str], np.ndarray]


class ConfigReader:
    """Typed access to an HF config dict with errors that name the field."""

    def __init__(self, config: dict, architecture: str):
        self.config = config
        self.arch = architecture

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key, default)
        return default if value is None else value

    def require(self, key: str) -> Any:
        if self.config.get(key) is None:
            raise ValueError(f"{self.arch} config: required field {key!r} is missing")
        return self.config[key]

    def unsupported(self, key: str, value: Any, supported: str) -> ValueError:
        return ValueError(
            f"{self.arch} config: {key}={value!r} is not supported ({supported})"
        )

    def rope(self, layer_type: str | None = None, legacy_theta_key: str = "rope_theta",
             default_theta: float = 10000.0) -> tuple[float, dict | None]:
        """(theta, scaling dict or None) from ``rope_parameters`` (transformers 5)
        or the older ``rope_theta`` / ``rope_scaling`` fields."""
        params = self.config.get("rope_parameters")
        if isinstance(params, dict) and layer_type is not None and layer_type in params:
            params = params[layer_type]
        if isinstance(params, dict) and "rope_theta" in params:
            theta = float(params["rope_theta"])
            scaling = params if params.get("rope_type", "default") != "default" else None
            return theta, scaling
        theta = float(self.get(legacy_theta_key, default_theta))
        scaling = self.config.get("rope_scaling")
        if layer_type == "sliding_attention":
            scaling = None  # legacy configs scale only the global rotary
        return theta, scaling


def eos_ids_from_config(config: dict) -> tuple[int, ...]:
    eos = config.get("eos_token_id")
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(int(e) for e in eos)


class CausalLM:
    """Base class; see the module docstring."""

    architecture: str = ""
    default_tie_word_embeddings: bool = True  # the HF config class's default

    def __init__(self, config: dict, dtype=jnp.float32, eos_token_ids=None):
        self.config = dict(config)
        self.dtype = jnp.dtype(dtype)
        self.cfg = ConfigReader(self.config, self.architecture)
        self.eos_token_ids = tuple(
            eos_token_ids if eos_token_ids is not None else eos_ids_from_config(config)
        )
        self.tie_word_embeddings = bool(self.cfg.get("tie_word_embeddings", self.default_tie_word_embeddings))
        self.final_logit_softcap: float | None = None

    def _make_info(self, *, num_layers, num_q_heads, num_kv_heads, head_dim, hidden_size,
                   vocab_size, max_model_len) -> ModelInfo:
        bos = self.config.get("bos_token_id")
        return ModelInfo(
            architecture=self.architecture,
            num_layers=int(num_layers),
            num_q_heads=int(num_q_heads),
            num_kv_heads=int(num_kv_heads),
            head_dim=int(head_dim),
            hidden_size=int(hidden_size),
            vocab_size=int(vocab_size),
            max_model_len=int(max_model_len),
            dtype=self.dtype,
            eos_token_ids=self.eos_token_ids,
            bos_token_id=bos if isinstance(bos, int) else None,
        )

    # -- engine interface ---------------------------------------------------------

    def allocate_kv_caches(self, num_pages: int, page_size: int, kv_cache_dtype=None):
        """One (pages [N, 2, Hkv, page_size, D], scales|None) pair per layer."""
        dtype = self.dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype
        if isinstance(dtype, str):
            if dtype not in kernels_pallas.KV_CACHE_DTYPES:
                dtype = jnp.dtype(dtype)
            else:
                dtype = kernels_pallas.KV_CACHE_DTYPES[dtype]
        info = self.info
        return kernels_pallas.allocate_kv_pages(
            info.num_layers, num_pages, page_size, info.num_kv_heads, info.head_dim, dtype
        )

    def compute_logits(
        self,
        params: dict,
        hidden: jax.Array,  # [R, H] output of forward at the rows to sample
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> jax.Array:  # f32[R, vocab]
        if "lm_head" in params:
            logits = L.matmul(hidden, params["lm_head"]["kernel"], plan)
        else:
            logits = L.matmul(hidden, params["embed_tokens"]["embedding"], plan, transposed=True)
        logits = logits.astype(jnp.float32)
        if self.final_logit_softcap:
            cap = self.final_logit_softcap
            logits = cap * jnp.tanh(logits / cap)
        return logits

    def forward(self, params, kv_caches, token_ids, meta,
                plan: ExecutionPlan = DEFAULT_PLAN):  # pragma: no cover - abstract
        raise NotImplementedError

    def params_from_hf(self, get: GetTensor) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- helpers for subclasses ---------------------------------------------------

    def _lm_head_from_hf(self, get: GetTensor, params: dict, name: str = "lm_head.weight"):
        if not self.tie_word_embeddings:
            params["lm_head"] = {"kernel": get(name).T}
        return params

    def _check_kv_caches(self, kv_caches) -> None:
        if len(kv_caches) != self.info.num_layers:
            raise ValueError(
                f"kv_caches: expected {self.info.num_layers} (pages, scales) pairs, got {len(kv_caches)}"
            )
