"""LoRA adapters inside the model: a fixed device slot table per target projection.

Every targeted :class:`pagedjax.models.nn.Linear` (kernel ``[In, *Out]``) gets a
:class:`LoRATable` with one slot per adapter the engine keeps on the device:

    a [N, In, R]      the slots' A matrices (PEFT ``lora_A.weight`` transposed)
    b [N, R, *Out]    the slots' B matrices, laid out like the kernel's output
                      axes, with the adapter's scaling (alpha / r) folded in

N = ``max_loras``; R = parts * ``max_lora_rank`` where a fused projection
(our q/k/v kernel ``[H, Hkv, G+2, D]``, gate/up ``[H, 2, I]``) stacks the
ranks of its parts (q, k, v): part p uses columns ``[p*r_max, (p+1)*r_max)``
of A and the matching rows of B, and B places them in that part's output
positions only. Ranks below ``max_lora_rank`` are zero-padded. Shapes never
depend on which adapters are loaded, so swapping adapters recompiles nothing.

The delta of a step's tokens (``slots`` i32[T], -1 = the base model) is the
grouped formulation, one pair of matmuls per projection for the whole batch,
no loop over adapters:

    h = x @ a[s]       computed for all slots at once: einsum(x, a) [T, N, R],
                       masked by one_hot(slots) (a row of -1 is all zero)
    y = h @ b          einsum over (N, R): each token picks its own slot's B

On CPU this measured 17x faster than gathering A and B per token (T=512,
In=576, R=24, N=5: 3.0 ms vs 50 ms; the base matmul 6.7 ms) and 3x faster than
sorting tokens into segments with ``lax.ragged_dot``; its cost grows with
N * R, which ``max_loras`` and ``max_lora_rank`` bound.

A is sharded like the kernel's input axis and B like its output axes (logical
axes below), so tensor parallelism splits both the way it splits the base
weight. The engine side (reading PEFT files, the LRU slot manager) lives in
``pagedjax/lora/``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pagedjax.models import nn

# PEFT module names a projection may be built from: q/k/v/o and the MLP, and the
# fused forms some checkpoints store (Phi-3).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                  "qkv_proj", "gate_up_proj")


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """Static shape of the slot tables."""

    max_loras: int  # device slots N
    max_rank: int  # r_max


@dataclasses.dataclass(frozen=True)
class LoRATarget:
    """One targeted projection: where its table lives and which PEFT modules feed it."""

    path: tuple  # module path of the Linear (e.g. ("layers", 0, "attn", "qkv_proj"))
    parts: tuple[str, ...]  # HF module names, e.g. "model.layers.0.self_attn.q_proj"
    spec: object  # the kernel's WeightSpec (rearranges HF [out, in] tensors to [in, *out])
    in_features: int
    out_shape: tuple[int, ...]


class LoRATable(nnx.Module):
    """The slot table of one projection (see the module docstring)."""

    def __init__(self, in_features: int, out_shape: tuple[int, ...], rank: int, num_slots: int,
                 in_axis, out_axes: tuple, *, dtype):
        self.a = nn.param((num_slots, in_features, rank), dtype, (None, in_axis, None))
        self.b = nn.param((num_slots, rank, *out_shape), dtype, (None, None, *out_axes))

    def __call__(self, x: jax.Array, slots: jax.Array) -> jax.Array:
        """x [T, In], slots i32[T] (-1: no adapter) -> delta [T, *Out]."""
        a, b = self.a[...], self.b[...]
        onehot = jax.nn.one_hot(slots, a.shape[0], dtype=x.dtype)  # [T, N]; -1 -> zeros
        h = jnp.einsum("ti,nir->tnr", x, a.astype(x.dtype)) * onehot[:, :, None]
        out = jnp.einsum("tnr,nr...->t...", h, b.astype(x.dtype))
        return out


def supports_lora(module_cls) -> bool:
    return bool(getattr(module_cls, "supports_lora", False))


def find_targets(abstract_module, weight_map: dict) -> list[LoRATarget]:
    """Every Linear whose kernel comes from PEFT-targetable HF projections."""
    out = []
    for path, node in nnx.iter_graph(abstract_module):
        if not isinstance(node, nn.Linear):
            continue
        key = ".".join(map(str, path)) + ".kernel"
        spec = weight_map.get(key)
        if spec is None or not all(n.endswith(".weight") for n in spec.names):
            continue
        parts = tuple(n[: -len(".weight")] for n in spec.names)
        if not all(p.rsplit(".", 1)[-1] in TARGET_MODULES for p in parts):
            continue
        shape = tuple(node.kernel.shape)
        out.append(LoRATarget(tuple(path), parts, spec, shape[0], shape[1:]))
    return out


def attach(module, targets: list[LoRATarget], spec: LoRASpec):
    """Give each target Linear its slot table (abstract construction, before loading)."""
    for t in targets:
        node = module
        for p in t.path:
            node = node[p] if isinstance(p, int) else getattr(node, p)
        axes = tuple(node.kernel.get_metadata().get("out_sharding")
                     or (None,) * (1 + len(t.out_shape)))
        dtype = node.kernel.dtype if not isinstance(node.kernel, nn.QuantizedWeight) else jnp.float32
        node.lora = nnx.data(LoRATable(t.in_features, t.out_shape, len(t.parts) * spec.max_rank,
                                       spec.max_loras, axes[0], axes[1:], dtype=dtype))
    return module


def slot_values(target: LoRATarget, max_rank: int,
                pieces: dict[str, tuple[np.ndarray, np.ndarray, float]]) -> tuple[np.ndarray, np.ndarray]:
    """One adapter's (a [In, R], b [R, *Out]) for ``target``.

    pieces: HF module name -> (lora_A [r, In], lora_B [out_part, r], scaling) for the
    parts the adapter has (missing parts stay zero). B is placed through the
    kernel's own WeightSpec: it only rearranges output axes, so applying it to
    ``[out_part, R]`` matrices (the rank axis standing in for the input axis)
    yields ``[R, *Out]`` in the fused layout. Raises ValueError when a matrix does
    not fit the base projection (an adapter of another base model).
    """
    r_all = len(target.parts) * max_rank
    sizes = part_out_sizes(target)
    a = np.zeros((target.in_features, r_all), np.float32)
    b_parts = [np.zeros((size, r_all), np.float32) for size in sizes]
    for p, name in enumerate(target.parts):
        if name not in pieces:
            continue
        la, lb, scale = pieces[name]
        r = la.shape[0]
        if la.shape[1] != target.in_features or lb.shape != (sizes[p], r) or r > max_rank:
            raise ValueError(
                f"LoRA adapter does not fit the base model at {name}: lora_A {la.shape}, "
                f"lora_B {lb.shape}, expected [r, {target.in_features}] and [{sizes[p]}, r] "
                f"with r <= {max_rank} (an adapter trained for another base model?)")
        a[:, p * max_rank:p * max_rank + r] = la.T
        b_parts[p][:, p * max_rank:p * max_rank + r] = lb * scale
    b = np.asarray(target.spec.build(b_parts), np.float32)
    if b.shape != (r_all, *target.out_shape):
        raise ValueError(f"LoRA: {'.'.join(map(str, target.path))}: B arranged to {b.shape}, "
                         f"expected {(r_all, *target.out_shape)}")
    return a, b


def part_out_sizes(target: LoRATarget) -> list[int]:
    """Output size of each HF part of a target: one part is the whole output; two
    (gate, up) are equal halves; three (q, k, v) split our [Hkv, G+2, D] layout
    into G query heads and one key and one value head per KV head."""
    total = int(np.prod(target.out_shape))
    n = len(target.parts)
    if n == 1:
        return [total]
    if n == 2:
        return [total // 2, total // 2]
    hkv, gp2, d = target.out_shape
    return [hkv * (gp2 - 2) * d, hkv * d, hkv * d]
