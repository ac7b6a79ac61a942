"""The shared skeleton of a causal LM: config parsing and the decoder module base.

An architecture is a Flax NNX module (subclass of :class:`DecoderLM`):

    __init__(config: dict, *, dtype, rngs)           parse the HF config, declare layers
    embed(token_ids, meta, plan) -> (x [T, H], ctx)  token (+ position) embedding; ctx is
                                                     whatever every layer needs (rotary)
    layers: nnx.List of layers, each
        layer(x, cache, meta, plan, ctx) -> (x, cache)
    final(x, plan) -> hidden [T, H]                  the final norm (projection)
    logits(hidden, plan) -> f32[R, V]                default: lm_head or the tied embedding
    weight_map() -> {param path: WeightSpec}         HF checkpoint names of every parameter
    info: ModelInfo                                  set in __init__

``pagedjax.models.runtime.CausalLM`` splits it into a graph and a parameter state and
runs it as a pure function. Parameters carry logical axes (``pagedjax.models.nn.param``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan, ModelInfo

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


def make_info(config: dict, architecture: str, dtype, *, num_layers, num_q_heads, num_kv_heads,
              head_dim, hidden_size, vocab_size, max_model_len, layer_windows=()) -> ModelInfo:
    """The engine's view of a model (KV pool shape, vocabulary, stop tokens)."""
    bos = config.get("bos_token_id")
    return ModelInfo(
        architecture=architecture, num_layers=int(num_layers), num_q_heads=int(num_q_heads),
        num_kv_heads=int(num_kv_heads), head_dim=int(head_dim), hidden_size=int(hidden_size),
        vocab_size=int(vocab_size), max_model_len=int(max_model_len), dtype=jnp.dtype(dtype),
        eos_token_ids=eos_ids_from_config(config),
        bos_token_id=bos if isinstance(bos, int) else None,
        layer_windows=tuple(layer_windows),
    )


# ----------------------------------------------------------------------------- weight maps


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """Where one parameter comes from: ``fn(*[get(n) for n in names])``.

    ``fn`` only rearranges (transposes, reshapes, stacks, concatenates along
    output axes), so the loader can apply it to each component of a weight
    that stays quantized as well.
    """

    names: tuple[str, ...]
    fn: Callable[..., np.ndarray] | None = None

    def build(self, arrays: list):
        return arrays[0] if self.fn is None else self.fn(*arrays)


def hf(name: str) -> WeightSpec:
    """The tensor as stored (norm scales, embeddings, biases, GPT-2 Conv1D kernels)."""
    return WeightSpec((name,))


def hf_linear(name: str) -> WeightSpec:
    """A PyTorch Linear weight [out, in] as our kernel [in, out]."""
    return WeightSpec((name,), _transpose)


def hf_fused(fn: Callable[..., np.ndarray], *names: str) -> WeightSpec:
    """A parameter built from several tensors (fused q/k/v, gate/up)."""
    return WeightSpec(tuple(names), fn)


def _transpose(w: np.ndarray) -> np.ndarray:
    return w.T


def pack_qkv(
    q: np.ndarray,  # [Hq*D, H]   HF Linear layout ([out, in])
    k: np.ndarray,  # [Hkv*D, H]
    v: np.ndarray,  # [Hkv*D, H]
    num_kv_heads: int,
    head_dim: int,
) -> np.ndarray:  # [H, Hkv, G+2, D]
    h = q.shape[1]
    g = q.shape[0] // (num_kv_heads * head_dim)
    qg = q.reshape(num_kv_heads, g, head_dim, h)
    kg = k.reshape(num_kv_heads, 1, head_dim, h)
    vg = v.reshape(num_kv_heads, 1, head_dim, h)
    return np.ascontiguousarray(np.concatenate([qg, kg, vg], axis=1).transpose(3, 0, 1, 2))


def pack_qkv_bias(
    q: np.ndarray,  # [Hq*D]
    k: np.ndarray,  # [Hkv*D]
    v: np.ndarray,  # [Hkv*D]
    num_kv_heads: int,
    head_dim: int,
) -> np.ndarray:  # [Hkv, G+2, D]
    g = q.shape[0] // (num_kv_heads * head_dim)
    return np.concatenate([q.reshape(num_kv_heads, g, head_dim),
                           k.reshape(num_kv_heads, 1, head_dim),
                           v.reshape(num_kv_heads, 1, head_dim)], axis=1)


def pack_gate_up(
    gate: np.ndarray,  # [I, H]  HF Linear layout
    up: np.ndarray,  # [I, H]
) -> np.ndarray:  # [H, 2, I]
    return np.ascontiguousarray(np.stack([gate.T, up.T], axis=1))


def qkv_spec(prefix: str, num_kv_heads: int, head_dim: int, kind: str = "weight") -> WeightSpec:
    """``{prefix}{q,k,v}_proj.{kind}`` fused into our grouped q/k/v layout."""
    names = [f"{prefix}{p}_proj.{kind}" for p in "qkv"]
    pack = pack_qkv if kind == "weight" else pack_qkv_bias
    return hf_fused(lambda q, k, v: pack(q, k, v, num_kv_heads, head_dim), *names)


# ----------------------------------------------------------------------------- module base


def merge_embeddings(
    x: jax.Array,  # [T, H] the tokens' embeddings
    mm_embeds: tuple | None,  # (embeddings [M, H], source i32[T]) or None
) -> jax.Array:  # [T, H]
    """Token t takes row ``source[t]`` of ``embeddings`` where ``source[t] >= 0`` (an
    image placeholder), its own embedding elsewhere: multimodal inputs enter the
    normal step this way, at a static shape per bucket."""
    if mm_embeds is None:
        return x
    embeds, source = mm_embeds
    rows = jnp.take(embeds, jnp.maximum(source, 0), axis=0).astype(x.dtype)
    return jnp.where((source >= 0)[:, None], rows, x)


class DecoderLM(nnx.Module):
    """Base of the architectures (see the module docstring)."""

    def __call__(
        self,
        kv_caches: tuple,  # per layer (pages [N, 2, Hkv, page_size, D], scales | None)
        token_ids: jax.Array,  # i32[T]
        meta: AttentionMetadata,
        plan: ExecutionPlan = DEFAULT_PLAN,
        mm_embeds: tuple | None = None,  # (embeddings [M, H], source i32[T]): see merge_embeddings
    ) -> tuple[jax.Array, tuple]:  # hidden [T, H], kv_caches
        if plan.kv_layout is not None:
            return self._grouped(kv_caches, token_ids, meta, plan, mm_embeds)
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches: expected {len(self.layers)} (pages, scales) pairs, "
                             f"got {len(kv_caches)}")
        x, ctx = self.embed(token_ids, meta, plan)
        x = merge_embeddings(x, mm_embeds)
        new = []
        for layer, cache in zip(self.layers, kv_caches):
            x, cache = layer(x, cache, meta, plan, ctx)
            new.append(cache)
        return self.final(x, plan), tuple(new)

    def _grouped(self, kv_caches, token_ids, meta, plan, mm_embeds):
        """Hybrid KV groups: layer i uses array kv_layout[i][1] and its group's table."""
        layout = plan.kv_layout
        if len(layout) != len(self.layers):
            raise ValueError(f"kv_layout: expected {len(self.layers)} (group, array) pairs, "
                             f"got {len(layout)}")
        x, ctx = self.embed(token_ids, meta, plan)
        x = merge_embeddings(x, mm_embeds)
        caches = list(kv_caches)
        metas = {g: meta.for_group(g) for g in sorted({g for g, _ in layout})}
        for layer, (g, k) in zip(self.layers, layout):
            x, caches[k] = layer(x, caches[k], metas[g], plan, ctx)
        return self.final(x, plan), tuple(caches)

    def logits(
        self,
        hidden: jax.Array,  # [R, H] output of __call__ at the rows to sample
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> jax.Array:  # f32[R, V]
        head = getattr(self, "lm_head", None)
        logits = head(hidden, plan) if head is not None else self.embed_tokens.attend(hidden, plan)
        logits = logits.astype(jnp.float32)
        cap = getattr(self, "final_logit_softcap", None)
        if cap:
            logits = cap * jnp.tanh(logits / cap)
        return logits
