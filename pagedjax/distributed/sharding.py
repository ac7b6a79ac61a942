"""Tensor parallelism over one mesh axis "tp": the mesh, the sharding rules, sharded loading.

Single host::

    LLM(model, tensor_parallel_size=N)       # or: pagedjax serve M -tp N

builds a ``Mesh`` over the first N devices, loads every weight straight into
its shards (host numpy slice -> one device; no device ever holds the whole
model) and allocates the KV pool sharded by KV head. The runner jits its step
with the pool's sharding pinned (``step_shardings``); GSPMD partitions the
rest. The custom attention kernels run per device through ``shard_map`` over
KV heads (``kernels_pallas.sharded_attention``, chosen by the execution plan).

Sharding rules (Megatron-style) are declared where the parameters are: each
parameter carries logical axis names (``models/nn.py``) and ``LOGICAL_AXIS_RULES``
below maps them to the mesh axis:

    qkv_proj.kernel [H, Hkv, G+2, D]   (embed, kv_heads, qkv, head_dim): KV heads
    qkv_proj.bias   [Hkv, G+2, D]      split, each device gets whole heads with their q
    o_proj.kernel   [Hq*D, H]          (heads, embed): row parallel, ordered by KV head
    gate_up.kernel  [H, 2, I]          (embed, None, mlp): column parallel
    down.kernel     [I, H]             (mlp, embed): row parallel
    fc1 [H, I] + bias [I]; fc2 [I, H]  mlp split
    embed_tokens.embedding [V, H]      (vocab, embed);  lm_head.kernel [H, V] (embed, vocab)
    everything else                    replicated (norms, biases of row-parallel
                                       layers, learned positions, OPT projections)
    quantized weights                  each component keeps its weight's axes; int4 /
                                       fp8 groups along a split input (o_proj, down)
                                       need tp to divide the number of groups
    LoRA slot tables a [N, In, R]      A on its kernel's input axis, B on its output
                     b [N, R, *Out]    axes (models/lora.py; tests/lora/test_lora_tp.py)
    KV pool [pages, 2, Hkv, page_size, D] split axis 2; int8/fp8 scales axis 2

A dimension N does not divide (intermediate size, vocabulary) is replicated
instead; KV heads must divide (``check_tensor_parallel`` names the sizes that
work). Multi-host runs (jax.distributed) live in ``pagedjax/distributed/multihost.py``.
No engine imports here.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "tp"

# ----------------------------------------------------------------------------- mesh


def check_tensor_parallel(info, tp: int, num_devices: int | None = None) -> None:
    """ValueError unless ``tp`` devices exist and ``tp`` divides the KV heads."""
    num_devices = jax.device_count() if num_devices is None else num_devices
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    ok = [n for n in range(1, info.num_kv_heads + 1)
          if info.num_kv_heads % n == 0 and n <= num_devices]
    if tp > num_devices:
        raise ValueError(
            f"tensor_parallel_size={tp} exceeds the {num_devices} available "
            f"{jax.default_backend()} device(s) (jax.device_count()); sizes that work for "
            f"this model here: {', '.join(map(str, ok))}. On CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={tp} before jax starts")
    if info.num_kv_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} does not divide the model's num_kv_heads="
            f"{info.num_kv_heads} (num_attention_heads={info.num_q_heads}); each device must "
            f"hold whole KV heads: use one of {', '.join(map(str, ok))}")


def check_expert_parallel(model, ep: int) -> None:
    """ValueError unless the expert-parallel size ``ep`` (the tensor-parallel size)
    divides a mixture-of-experts model's expert count (dense models: nothing to check)."""
    moe = getattr(model.abstract, "moe", None)
    if moe is None:
        return
    e, kv = moe.num_experts, model.info.num_kv_heads
    if e % ep:
        ok = [n for n in range(1, e + 1) if e % n == 0 and kv % n == 0]
        raise ValueError(
            f"enable_expert_parallel: the model's num_experts={e} is not divisible by the "
            f"expert-parallel size {ep} (= tensor_parallel_size): each device must hold whole "
            f"experts; use tensor_parallel_size in {', '.join(map(str, ok))}, or turn "
            "enable_expert_parallel off")


def make_mesh(tp: int, devices: Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh named "tp" over ``devices`` (default: the first ``tp`` of jax.devices())."""
    devices = list(jax.devices() if devices is None else devices)
    if tp > len(devices):
        raise ValueError(f"tensor_parallel_size={tp} exceeds the {len(devices)} device(s) given")
    if jax.process_count() > 1 and tp != len(devices):
        raise ValueError(
            f"multi-host tensor parallelism shards over every device of every process: "
            f"tensor_parallel_size must be jax.device_count()={len(devices)}, got {tp}. "
            "For more throughput run independent replicas instead")
    return Mesh(np.array(devices[:tp]), (AXIS,))


def path_str(path) -> str:
    parts = []
    for k in path:
        key = getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
        parts.append(str(key))
    return "/".join(parts)


# One table: logical axis (declared with each parameter, see models/nn.py) -> mesh axis.
# Axes not listed (embed, qkv, head_dim, pos, norm) are replicated.
LOGICAL_AXIS_RULES: dict[str, str] = {
    "vocab": AXIS,      # embedding rows, LM head columns
    "kv_heads": AXIS,   # fused q/k/v kernel [H, Hkv, G+2, D] and its bias: whole heads
    "heads": AXIS,      # o_proj input Hq*D (row parallel, ordered by KV head)
    "mlp": AXIS,        # MLP intermediate size (column parallel in, row parallel out)
    "experts": AXIS,    # mixture-of-experts weights [E, ...]: whole experts, under
    #                     enable_expert_parallel only (else each expert's "mlp" axis)
}


def logical_spec(axes: tuple, shape: tuple[int, ...], tp: int,
                 expert_parallel: bool = False) -> P:
    """The PartitionSpec of a parameter with logical ``axes``: each axis the table
    maps is split when ``tp`` divides its size, else replicated (the first split
    axis wins; "experts" only under ``expert_parallel``)."""
    spec, used = [], set()
    for name, size in zip(axes, shape):
        mesh_axis = LOGICAL_AXIS_RULES.get(name) if name else None
        if name == "experts" and not expert_parallel:
            mesh_axis = None
        if mesh_axis is None or tp == 1 or size % tp or mesh_axis in used:
            spec.append(None)
        else:
            spec.append(mesh_axis)
            used.add(mesh_axis)
    return P(*spec)


def param_specs(model, tp: int, expert_parallel: bool = False) -> dict:
    """The state of ``model`` (a models.CausalLM) as a nested dict of PartitionSpecs."""
    from flax import nnx

    axes = nnx.traversals.flatten_mapping(model.logical_axes(), is_leaf=lambda _, x: isinstance(x, tuple))
    shapes = model.param_shapes()
    specs = {p: logical_spec(a, tuple(shapes[".".join(map(str, p))].shape), tp, expert_parallel)
             for p, a in axes.items()}
    return nnx.traversals.unflatten_mapping(specs)


def shard_params(tree, model, mesh: Mesh, expert_parallel: bool = False):
    """Host numpy state -> jax arrays laid out by ``param_specs``.

    Each device receives only its slice (``jax.make_array_from_callback`` asks
    for the addressable shards only), so a device never holds a whole tensor
    that is split, and another process's shards are never materialised here.
    Arrays keep the dtypes the host state has (pagedjax.models.weights.cast_like).
    """
    specs = param_specs(model, mesh.devices.size, expert_parallel)
    return jax.tree_util.tree_map(lambda arr, spec: place_shards(arr, mesh, spec), tree, specs)


def place_shards(arr, mesh: Mesh, spec: P) -> jax.Array:
    """One host array -> a jax array laid out by ``spec``, each device given its slice."""
    return jax.make_array_from_callback(
        tuple(arr.shape), NamedSharding(mesh, spec),
        lambda idx: np.ascontiguousarray(np.asarray(arr[idx])))


def check_quantized_groups(model, tp: int) -> None:
    """ValueError when a weight kept in groups along a split input axis (int4 / fp8
    blocks on o_proj's or down's input) would not give each device whole groups:
    ``tp`` must divide that input's number of groups (one group, per channel: the
    scales are replicated)."""
    if tp == 1:
        return
    shapes, axes = model.param_shapes(), None
    for path, kind in model.quantized.items():
        key = ".".join(map(str, path))
        if f"{key}.s" not in shapes or not kind.startswith(("int4_g", "fp8_g")):
            continue
        if axes is None:
            from flax import nnx

            axes = dict(nnx.traversals.flatten_mapping(
                model.logical_axes(), is_leaf=lambda _, x: isinstance(x, tuple)))
        in_axis = axes[path + ("s",)][0]
        groups = shapes[f"{key}.s"].shape[0]
        n_in = groups * int(kind.split("_g")[1].split("_")[0])
        if LOGICAL_AXIS_RULES.get(in_axis) and n_in % tp == 0 and groups % tp and groups > 1:
            raise ValueError(
                f"tensor_parallel_size={tp}: {key} ({kind}) has {groups} groups along its "
                f"{n_in} inputs, which {tp} devices cannot split into whole groups; use a "
                f"tensor_parallel_size that divides {groups}")


def load_sharded(model: str | None, dtype="auto", tp: int = 1, devices=None,
                 quantization: str | None = None, *, resolved=None, expert_parallel: bool = False):
    """-> (model, params, mesh): ``models.load_model`` with weights loaded into shards
    (``resolved``: a ``models.ResolvedModel`` already found, instead of ``model``)."""
    import pagedjax.models as models

    resolved = resolved or models.resolve_model(model)
    abstract = models.build_model(resolved, dtype)
    check_tensor_parallel(abstract.info, tp, len(devices) if devices is not None else None)
    if expert_parallel:
        check_expert_parallel(abstract, tp)
    mesh = make_mesh(tp, devices)

    def placer(m):  # each tensor is read and placed in its shards before the next
        from flax import nnx

        check_quantized_groups(m, mesh.devices.size)

        flat = nnx.traversals.flatten_mapping(param_specs(m, mesh.devices.size, expert_parallel))
        specs = {".".join(map(str, p)): s for p, s in flat.items()}
        return lambda name, arr: place_shards(arr, mesh, specs[name])

    m, params = models.prepare(resolved, dtype, quantization, placer=placer)
    return m, params, mesh


def kv_shardings(mesh: Mesh):
    """(pages sharding, scales sharding) of one layer of the KV pool."""
    return (NamedSharding(mesh, P(None, None, AXIS, None, None)),
            NamedSharding(mesh, P(None, None, AXIS, None)))


def allocate_sharded_kv(model, mesh: Mesh, num_pages: int, page_size: int, kv_cache_dtype=None,
                        num_arrays: int | None = None):
    """One (pages, scales|None) pair per layer (or ``num_arrays``: hybrid KV groups),
    created directly in its shards."""
    import pagedjax.kernels_pallas as kernels_pallas

    info = model.info
    dtype = model.dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype
    if isinstance(dtype, str):
        dtype = kernels_pallas.KV_CACHE_DTYPES.get(dtype, dtype)
    dtype = jnp.dtype(dtype)
    pages_sh, scales_sh = kv_shardings(mesh)
    shape = (num_pages, 2, info.num_kv_heads, page_size, info.head_dim)
    zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=pages_sh)
    ones = jax.jit(lambda: jnp.ones(shape[:4], jnp.float32), out_shardings=scales_sh)
    quant = kernels_pallas.is_quantized(dtype)
    return tuple((zeros(), ones() if quant else None)
                 for _ in range(num_arrays or info.num_layers))


def bytes_per_device(tree) -> dict[int, int]:
    """Device id -> bytes of ``tree``'s shards held there (addressable devices only)."""
    out: dict[int, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


def step_shardings(mesh: Mesh, kv_caches):
    """(replicated, KV pool shardings) to pin on the jitted step's outputs.

    Without ``out_shardings`` GSPMD may return the donated pool in another
    layout (breaking the in-place update and the 1/N memory); sampled tokens
    and logprobs come back replicated so every process can read them.
    """
    return NamedSharding(mesh, P()), jax.tree_util.tree_map(lambda a: a.sharding, kv_caches)
