"""Flax NNX building blocks of the models: weights with logical axes, thin layers.

Every parameter is declared with its logical axes (``param(shape, dtype,
axes)``); ``pagedjax/distributed/sharding.py`` maps logical axes to the ``tp`` mesh axis
with one table (``LOGICAL_AXIS_RULES``). The names used here:

    embed      the hidden size H (replicated)
    vocab      the vocabulary (split under TP when it divides)
    kv_heads   KV heads of a fused q/k/v projection (split: whole heads per device)
    heads      the merged query-head axis Hq*D of o_proj's input (split)
    mlp        the MLP's intermediate size (split)
    qkv, head_dim, pos, norm     never split

Modules hold parameters and static configuration only; everything that
changes the compiled program per run (backend, matmul routing, mesh) comes in
the ``plan`` argument of each call. Weights are float arrays or, once
:func:`quantize_weights` has replaced them, :class:`QuantizedWeight` modules
that dequantize inside the step (see ``models/quant.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import pagedjax.kernels_pallas as kernels_pallas
from pagedjax.models import layers as L
from pagedjax.models import quant as Q
from pagedjax.models.base import DEFAULT_PLAN, AttentionMetadata, ExecutionPlan

Axes = tuple[str | None, ...]


def param(shape, dtype, axes: Axes) -> nnx.Param:
    """A parameter of ``shape`` carrying its logical ``axes`` (zeros: weights are always loaded)."""
    shape = tuple(int(s) for s in shape)
    if len(axes) != len(shape):
        raise ValueError(f"param: {len(axes)} logical axes {axes} for shape {shape}")
    return nnx.Param(jnp.zeros(shape, dtype), out_sharding=tuple(axes), eager_sharding=False)


class QuantizedWeight(nnx.Module):
    """One weight kept quantized: ``kind`` (see models/quant.py), its logical
    ``shape``, the quantized ``axis``; components are parameters named by kind."""

    def __init__(self, kind: str, shape: tuple[int, ...], axes: Axes, axis: int):
        self.kind, self.shape, self.axis = kind, tuple(shape), axis
        dtypes = Q.component_dtypes(kind)
        ax = axis % len(shape)
        divs = {name: div for name, (_, div) in Q.formats(kind).items()}
        for name, cshape in Q.component_shapes(kind, self.shape, axis).items():
            caxes = (axes if divs[name] > 0 else (axes[ax],) if divs[name] < 0
                     else axes[:ax] + axes[ax + 1:])
            setattr(self, name, param(cshape, dtypes[name], caxes))

    def components(self) -> dict[str, jax.Array]:
        return {name: getattr(self, name)[...] for name in Q.formats(self.kind)}

    def dequantize(self, dtype) -> jax.Array:  # [shape]
        return Q.dequantize(self.kind, self.components(), self.axis, dtype)


def weight_value(w, dtype) -> jax.Array:
    """The float array of a weight (a Param or a QuantizedWeight)."""
    if isinstance(w, QuantizedWeight):
        return w.dequantize(dtype)
    return w[...]


def qmatmul(x: jax.Array, w, plan: ExecutionPlan) -> jax.Array:
    """``x [T, In] @ w [In, ...Out]`` for a float or quantized weight ([T, ...Out])."""
    # int8 in the C++ kernel where the plan runs float32 matmuls of these rows there (the
    # weight read as int8, never widened in memory); GGUF blocks in the C++ block kernel
    # for the rows the plan sends there (widened in registers). Otherwise dequantized chunk by chunk
    # on one device for steps of few rows; whole for many rows (one dequantization then
    # serves them all) and under tensor parallelism (a scan over a sharded In axis would
    # make GSPMD gather the weight).
    if not isinstance(w, QuantizedWeight):
        return L.matmul(x, w[...], plan)
    kind, c, x = Q.gather_perm(w.kind, w.components(), x)  # act-order: x's columns
    if kind == "int8" and L.native_int8(x, plan):
        return L.int8_matmul(x, c["q"], c["scale"])
    if Q.block_kernel_kind(kind) and L.native_block(x, plan):
        return L.block_matmul(x, kind, c)
    if Q.chunked(x.shape[0], plan.mesh):
        return Q.chunked_matmul(kind, c, x, lambda a, b: L.matmul(a, b, plan))
    if kind in Q.PER_CHANNEL:  # scale after the matmul
        y = L.matmul(x, c["q"].astype(x.dtype), plan)
        return y * c["scale"].astype(x.dtype)
    return L.matmul(x, Q.dequantize(kind, c, 0, x.dtype), plan)


class Linear(nnx.Module):
    """``y = x @ kernel (+ bias)``; kernel [In, *Out] with logical axes ``(in_axis, *out_axes)``."""

    def __init__(self, in_features: int, out_shape, axes: Axes, *, bias: bool = False,
                 dtype=jnp.float32):
        out_shape = (out_shape,) if isinstance(out_shape, int) else tuple(out_shape)
        self.kernel = param((in_features, *out_shape), dtype, axes)
        self.bias = param(out_shape, dtype, axes[1:]) if bias else None
        self.lora = None  # a pagedjax.models.lora.LoRATable when LoRA serving is on

    def __call__(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN,
                 lora_slots: jax.Array | None = None) -> jax.Array:
        """x [T, In] -> [T, *Out]; lora_slots i32[T]: each token's adapter slot (-1: none)."""
        y = qmatmul(x, self.kernel, plan)
        if self.bias is not None:
            y = y + self.bias[...]
        if self.lora is not None and lora_slots is not None:
            y = y + self.lora(x, lora_slots)
        return y


class Embed(nnx.Module):
    """Token (or position) embedding [V, H]; ``attend`` is the tied LM head."""

    def __init__(self, num: int, features: int, *, dtype=jnp.float32, axes: Axes = ("vocab", "embed")):
        self.embedding = param((num, features), dtype, axes)
        self.dtype = jnp.dtype(dtype)  # of the rows, also when the table is quantized

    def __call__(self, ids: jax.Array, dtype=None) -> jax.Array:  # i32[T] -> [T, H]
        w = self.embedding
        if isinstance(w, QuantizedWeight):  # gather the rows, then dequantize them
            rows = {k: jnp.take(v, ids, axis=0) for k, v in w.components().items()}
            return Q.dequantize(w.kind, rows, w.axis, dtype or self.dtype)
        x = jnp.take(w[...], ids, axis=0)
        return x if dtype is None else x.astype(dtype)

    def attend(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:
        """x [R, H] -> [R, V] (x @ embedding.T)."""
        w = self.embedding
        if isinstance(w, QuantizedWeight) and w.kind == "int8" and L.native_int8(x, plan):
            c = w.components()
            return L.int8_matmul(x, c["q"], c["scale"], transposed=True)
        if isinstance(w, QuantizedWeight) and w.kind in Q.GGUF_KINDS.values() and \
                L.native_block(x, plan):
            return L.block_matmul(x, w.kind, w.components(), transposed=True)
        if isinstance(w, QuantizedWeight) and Q.chunked(x.shape[0], plan.mesh):  # vocab chunks
            return Q.chunked_matmul_t(w.kind, w.components(), x,
                                      lambda a, b: L.matmul(a, b, plan, transposed=True))
        if isinstance(w, QuantizedWeight) and w.kind == "int8":
            c = w.components()
            return L.matmul(x, c["q"].astype(x.dtype), plan, transposed=True) * c["scale"]
        return L.matmul(x, weight_value(w, x.dtype), plan, transposed=True)


class RMSNorm(nnx.Module):
    def __init__(self, features: int, eps: float, *, unit_offset: bool = False,
                 dtype=jnp.float32):
        self.scale = param((features,), dtype, ("norm",))
        self.eps, self.unit_offset = eps, unit_offset

    def __call__(self, x: jax.Array) -> jax.Array:  # [..., features]
        return L.rms_norm(x, self.scale[...], self.eps, add_unit_offset=self.unit_offset)


class LayerNorm(nnx.Module):
    def __init__(self, features: int, eps: float, *, dtype=jnp.float32):
        self.scale = param((features,), dtype, ("norm",))
        self.bias = param((features,), dtype, ("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:  # [..., features]
        return L.layer_norm(x, self.scale[...], self.bias[...], self.eps)


class GatedMLP(nnx.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused: gate_up.kernel [H, 2, I]."""

    def __init__(self, hidden: int, inter: int, act: str, *, dtype=jnp.float32):
        self.gate_up = Linear(hidden, (2, inter), ("embed", None, "mlp"), dtype=dtype)
        self.down = Linear(inter, hidden, ("mlp", "embed"), dtype=dtype)
        self.act = L.activation(act)

    def __call__(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN,
                 lora_slots: jax.Array | None = None) -> jax.Array:
        gu = self.gate_up(x, plan, lora_slots)  # [T, 2, I]
        return self.down(self.act(gu[:, 0]) * gu[:, 1], plan, lora_slots)


class PlainMLP(nnx.Module):
    """``fc2(act(fc1(x)))`` with biases (GPT-2, OPT)."""

    def __init__(self, hidden: int, inter: int, act: str, *, dtype=jnp.float32):
        self.fc1 = Linear(hidden, inter, ("embed", "mlp"), bias=True, dtype=dtype)
        self.fc2 = Linear(inter, hidden, ("mlp", "embed"), bias=True, dtype=dtype)
        self.act = L.activation(act)

    def __call__(self, x: jax.Array, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:
        return self.fc2(self.act(self.fc1(x, plan)), plan)


class Attention(nnx.Module):
    """Paged attention: fused q/k/v projection grouped by KV head, optional q/k
    norms and rotary, K/V written to the pool, the ragged paged-attention kernel,
    output projection.

        qkv_proj.kernel [H, Hkv, G+2, D]  slot g < G of group k is query head k*G+g,
                                          slot G its key, slot G+1 its value
        o_proj.kernel   [Hq*D, H]
    """

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 sm_scale: float, qkv_bias: bool = False, o_bias: bool = False,
                 qk_norm_eps: float | None = None, qk_norm_unit_offset: bool = False,
                 sliding_window: int | None = None, soft_cap: float | None = None,
                 dtype=jnp.float32):
        g = num_heads // num_kv_heads
        self.qkv_proj = Linear(hidden, (num_kv_heads, g + 2, head_dim),
                               ("embed", "kv_heads", "qkv", "head_dim"), bias=qkv_bias, dtype=dtype)
        self.o_proj = Linear(num_heads * head_dim, hidden, ("heads", "embed"), bias=o_bias,
                             dtype=dtype)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, unit_offset=qk_norm_unit_offset, dtype=dtype)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, unit_offset=qk_norm_unit_offset, dtype=dtype)
        else:
            self.q_norm = self.k_norm = None
        self.sm_scale, self.sliding_window, self.soft_cap = sm_scale, sliding_window, soft_cap

    def __call__(
        self,
        x: jax.Array,  # [T, H] (already normed)
        cache: tuple,  # (pages [N, 2, Hkv, page_size, D], scales [N, 2, Hkv, page_size] | None)
        meta: AttentionMetadata,
        plan: ExecutionPlan = DEFAULT_PLAN,
        rope: tuple[jax.Array, jax.Array] | None = None,  # cos, sin [T, D/2]
    ) -> tuple[jax.Array, tuple]:  # out [T, H], cache
        t = x.shape[0]
        y = self.qkv_proj(x, plan, meta.lora_slots)  # [T, Hkv, G+2, D]
        g = y.shape[2] - 2
        q, k, v = y[:, :, :g], y[:, :, g], y[:, :, g + 1]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = L.apply_rotary(q, *rope), L.apply_rotary(k, *rope)
        pages, scales = cache
        pages, scales = kernels_pallas.write_kv(pages, scales, k, v, meta.slot_mapping)
        hkv, d = q.shape[1], q.shape[3]
        out = L.attention_kernel(plan)(
            q.reshape(t, hkv * g, d), pages, meta.kv_lens, meta.page_table, meta.cu_q_lens,
            meta.num_seqs, sm_scale=self.sm_scale, sliding_window=self.sliding_window,
            soft_cap=self.soft_cap, kv_scales=scales, max_q_len=meta.max_q_len,
            backend=plan.attn_backend,
        )  # [T, Hq, D]
        return self.o_proj(out.reshape(t, hkv * g * d), plan, meta.lora_slots), (pages, scales)


# ----------------------------------------------------------------------------- quantization


def quantizable(module: nnx.Module) -> dict[tuple, tuple[nnx.Module, str, int]]:
    """Path of each weight that can be kept quantized -> (owner, attribute, quantized axis):
    every :class:`Linear` kernel (axis 0) and :class:`Embed` table (axis -1)."""
    out = {}
    for path, node in nnx.iter_graph(module):
        if isinstance(node, Linear) and isinstance(node.kernel, nnx.Param):
            out[tuple(path) + ("kernel",)] = (node, "kernel", 0)
        elif isinstance(node, Embed) and isinstance(node.embedding, nnx.Param):
            out[tuple(path) + ("embedding",)] = (node, "embedding", -1)
    return out


def quantize_weights(module: nnx.Module, kinds: dict[tuple, str]) -> nnx.Module:
    """Replace the weights at ``kinds``' paths by QuantizedWeight modules (abstract
    construction, before loading); returns ``module``."""
    table = quantizable(module)
    for path, kind in kinds.items():
        if path not in table:
            raise ValueError(f"quantize_weights: {'.'.join(map(str, path))} is not a Linear "
                             "kernel or an Embed table")
        owner, attr, axis = table[path]
        p = getattr(owner, attr)
        axes = tuple(p.get_metadata().get("out_sharding") or (None,) * p.ndim)
        setattr(owner, attr, QuantizedWeight(kind, tuple(p.shape), axes, axis))
    return module

