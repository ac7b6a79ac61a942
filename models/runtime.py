"""A Flax NNX model run as a pure function: what the engine talks to.

    model = CausalLM(LlamaForCausalLM, hf_config, dtype)   # abstract: shapes only
    params = model.load(checkpoint)                          # the state, as a dict of arrays
    hidden, kv = model.forward(params, kv, token_ids, meta, plan)
    logits = model.compute_logits(params, hidden, plan)

The module is built once under ``nnx.eval_shape`` (no weights allocated) and
split into a static graph (``graphdef``) and an abstract state whose leaves
carry the logical axes of each parameter. ``params`` is that state as a plain
nested dict of arrays (``nnx.State.to_pure_dict``), so ``jax.jit`` sees an
ordinary pytree; ``forward`` merges graph and state inside the trace, which
costs nothing at run time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import pagedjax.kernels_pallas as kernels_pallas
from pagedjax.models import nn
from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan, ModelInfo
from pagedjax.models.common import GetTensor, WeightSpec, merge_embeddings


def path_str(path) -> str:
    return ".".join(str(p) for p in path)


class CausalLM:
    """Engine interface over an NNX decoder module class (see models/common.py)."""

    def __init__(self, module_cls, config: dict, dtype=jnp.float32, *,
                 quantized: dict[tuple, str] | None = None, lora=None):
        self.module_cls = module_cls
        self.config = dict(config)
        self.dtype = jnp.dtype(dtype)
        self.quantized = dict(quantized or {})
        self.lora = lora  # pagedjax.models.lora.LoRASpec | None: slot tables on the target projections
        self.architecture = getattr(module_cls, "architecture", module_cls.__name__)
        self.lora_targets = []

        def build():
            m = module_cls(self.config, dtype=self.dtype, rngs=nnx.Rngs(0))
            m = nn.quantize_weights(m, self.quantized) if self.quantized else m
            if lora is not None:
                from pagedjax.models import lora as lora_mod

                self.lora_targets = lora_mod.find_targets(m, m.weight_map())
                lora_mod.attach(m, self.lora_targets, lora)
            return m

        self.abstract = nnx.eval_shape(build)
        self.graphdef, self.abstract_state = nnx.split(self.abstract)
        self.info: ModelInfo = self.abstract.info
        layers = list(getattr(self.abstract, "layers", []))
        self._layer_graphdefs = [nnx.graphdef(layer) for layer in layers]

    def with_quantization(self, kinds: dict[tuple, str]) -> "CausalLM":
        """The same model with the weights at ``kinds``' paths kept quantized."""
        return CausalLM(self.module_cls, self.config, self.dtype, quantized=kinds, lora=self.lora)

    def with_lora(self, spec) -> "CausalLM":
        """The same model with LoRA slot tables (``pagedjax.models.lora.LoRASpec``) on every
        projection an adapter can target; ValueError if the architecture has none."""
        from pagedjax.models import lora as lora_mod

        if not lora_mod.supports_lora(self.module_cls):
            raise ValueError(f"enable_lora: {self.architecture} does not support LoRA adapters "
                             "(supported: Llama, Mistral, Qwen2, Qwen3 and Phi-3 architectures)")
        return CausalLM(self.module_cls, self.config, self.dtype, quantized=self.quantized,
                        lora=spec)

    # -- engine interface -----------------------------------------------------------

    def forward(
        self,
        params: dict,  # the state (see load)
        kv_caches: tuple,  # per layer (pages [N, 2, Hkv, page_size, D], scales | None);
        #                    stacked [L, N, ...] pair after stack_kv_caches
        token_ids: jax.Array,  # i32[T]
        meta: AttentionMetadata,
        plan: ExecutionPlan = DEFAULT_PLAN,
        mm_embeds: tuple | None = None,  # (image embeddings [M, H], source i32[T]) or None
    ) -> tuple[jax.Array, tuple]:  # hidden [T, H], kv_caches
        if self._stacked(params):
            return self._forward_scanned(params, kv_caches, token_ids, meta, plan, mm_embeds)
        if mm_embeds is None:
            return nnx.merge(self.graphdef, params)(kv_caches, token_ids, meta, plan)
        return nnx.merge(self.graphdef, params)(kv_caches, token_ids, meta, plan, mm_embeds)

    @property
    def is_multimodal(self) -> bool:
        """Whether the module takes images (has ``encode_images``)."""
        return callable(getattr(self.module_cls, "encode_images", None))

    @property
    def uses_mrope(self) -> bool:
        """Whether steps carry three rotary position rows (``meta.mrope_positions``)."""
        return bool(getattr(self.module_cls, "uses_mrope", False))

    def encoder_inputs(self, data):
        """One image's encoder data (``MMItem.data``) -> the encoder program's input
        at its static patch bucket (host numpy): the module's ``encoder_inputs``, or
        the image's pixels as a batch of one."""
        prep = getattr(self.abstract, "encoder_inputs", None)
        return prep(data) if prep is not None else np.asarray(data, np.float32)[None]

    def encode_images(
        self,
        params: dict,
        pixel_values,  # encoder_inputs(...): f32[N, C, S, S] (LLaVA) or the module's pytree
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> jax.Array:  # [N, tokens per image, H] or [rows, H]: embeddings of the placeholders
        if self._stacked(params):
            params = self._unstacked_placeholder(params)
        return nnx.merge(self.graphdef, params).encode_images(pixel_values, plan)

    def compute_logits(
        self,
        params: dict,
        hidden: jax.Array,  # [R, H] output of forward at the rows to sample
        plan: ExecutionPlan = DEFAULT_PLAN,
    ) -> jax.Array:  # f32[R, vocab]
        if self._stacked(params):
            params = self._unstacked_placeholder(params)
        return nnx.merge(self.graphdef, params).logits(hidden, plan)

    def allocate_kv_caches(self, num_pages: int, page_size: int, kv_cache_dtype=None,
                           num_arrays: int | None = None):
        """One (pages [N, 2, Hkv, page_size, D], scales|None) pair per layer (or
        ``num_arrays`` of them: hybrid KV groups, core/kv_groups.py)."""
        dtype = self.dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype
        if isinstance(dtype, str):
            dtype = kernels_pallas.KV_CACHE_DTYPES.get(dtype) or jnp.dtype(dtype)
        from pagedjax.kernels_pallas.cpu import zero_pages  # zeroed without writing (CPU)

        info = self.info
        return kernels_pallas.allocate_kv_pages(
            num_arrays or info.num_layers, num_pages, page_size, info.num_kv_heads, info.head_dim,
            dtype, zeros=zero_pages.zeros)

    # -- weights ---------------------------------------------------------------------

    def weight_map(self) -> dict[str, WeightSpec]:
        """Dotted parameter path -> WeightSpec (HF names), from the module."""
        return self.abstract.weight_map()

    def param_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Dotted path of every state leaf -> its shape and dtype."""
        flat = nnx.to_flat_state(self.abstract_state)
        return {path_str(p): jax.ShapeDtypeStruct(v.shape, v.dtype) for p, v in flat}

    def logical_axes(self) -> dict:
        """The state as a nested dict of logical-axis tuples (None entries: never split)."""
        def axes(v):
            a = v.get_metadata().get("out_sharding")
            return tuple(a) if a else (None,) * len(v.shape)
        flat = nnx.to_flat_state(self.abstract_state)
        return nnx.traversals.unflatten_mapping({tuple(p): axes(v) for p, v in flat})

    # -- scanned layers ---------------------------------------------------------------
    # One compiled layer body run num_layers times (lax.scan) instead of
    # num_layers unrolled copies: compile time drops several-fold on CPU.
    # Layer parameters are stacked along a leading axis and the KV pool of all
    # layers is one array [L, N, 2, Hkv, page_size, D]; layer l addresses it as
    # a flat pool of L*N pages with its page ids offset by l*N.

    def can_scan(self) -> bool:
        """Every layer has the same graph (same sliding window, same static settings)."""
        g = self._layer_graphdefs
        return bool(g) and all(x == g[0] for x in g[1:])

    @staticmethod
    def stack_params(params: dict) -> dict:
        layers = params["layers"]
        out = dict(params)
        out["layers"] = jax.tree_util.tree_map(
            lambda *xs: jnp.stack(xs), *[layers[i] for i in range(len(layers))])
        return out

    @staticmethod
    def stack_kv_caches(kv_caches: tuple) -> tuple:
        pages = jnp.stack([p for p, _ in kv_caches])
        scales = None if kv_caches[0][1] is None else jnp.stack([s for _, s in kv_caches])
        return (pages, scales)

    def _stacked(self, params: dict) -> bool:
        layers = params.get("layers") if isinstance(params, dict) else None
        return isinstance(layers, dict) and bool(layers) and 0 not in layers

    def _unstacked_placeholder(self, params: dict) -> dict:
        """The stacked state with layer 0's slice standing in for every layer (for the
        embedding, the final norm and the head, which never call a layer)."""
        first = jax.tree_util.tree_map(lambda a: a[0], params["layers"])
        return {**params, "layers": {i: first for i in range(self.info.num_layers)}}

    def _forward_scanned(self, params, kv_caches, token_ids, meta, plan, mm_embeds=None):
        import dataclasses

        model = nnx.merge(self.graphdef, self._unstacked_placeholder(params))
        layer_gdef = self._layer_graphdefs[0]
        pages, scales = kv_caches  # [L, N, 2, Hkv, page_size, D], [L, N, 2, Hkv, page_size]
        n_layers, n_pages, page_size = pages.shape[0], pages.shape[1], pages.shape[4]
        flat = pages.reshape((n_layers * n_pages,) + pages.shape[2:])
        flat_s = None if scales is None else scales.reshape((n_layers * n_pages,) + scales.shape[2:])
        x, ctx = model.embed(token_ids, meta, plan)
        x = merge_embeddings(x, mm_embeds)

        def body(carry, lp):
            x, flat, flat_s, idx = carry
            off = idx * n_pages
            lmeta = dataclasses.replace(meta, page_table=meta.page_table + off,
                                        slot_mapping=meta.slot_mapping + off * page_size)
            x, (flat, flat_s) = nnx.merge(layer_gdef, lp)(x, (flat, flat_s), lmeta, plan, ctx)
            return (x, flat, flat_s, idx + 1), None

        (x, flat, flat_s, _), _ = jax.lax.scan(body, (x, flat, flat_s, jnp.int32(0)),
                                               params["layers"])
        new = (flat.reshape(pages.shape),
               None if flat_s is None else flat_s.reshape(scales.shape))
        return model.final(x, plan), new


def model_weight_bytes(params) -> int:
    """Bytes of all parameter arrays (global sizes; quantized components as stored)."""
    return int(sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape))
                   for a in jax.tree_util.tree_leaves(params)))

