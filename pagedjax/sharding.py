"""Tensor parallelism over one mesh axis "tp": the mesh, the sharding rules, sharded loading.

Single host::

    LLM(model, tensor_parallel_size=N)       # or: pagedjax serve M -tp N

builds a ``Mesh`` over the first N devices, loads every weight straight into
its shards (host numpy slice -> one device; no device ever holds the whole
model) and allocates the KV pool sharded by KV head. The runner jits its step
with the pool's sharding pinned (``step_shardings``); GSPMD partitions the
rest. The custom attention kernels run per device through ``shard_map`` over
KV heads (``kernels_pallas.sharded_attention``, chosen by the execution plan).

Sharding rules (Megatron-style; matched on the parameter path):

    qkv_proj.kernel [H, Hkv, G+2, D]   split axis 1 (KV heads; each device gets
    qkv_proj.bias   [Hkv, G+2, D]      axis 0        whole heads with their q)
    o_proj.kernel   [Hq*D, H]          split axis 0 (row parallel, ordered by KV head)
    gate_up.kernel  [H, 2, I]          split axis 2 (column parallel)
    down.kernel     [I, H]             split axis 0 (row parallel)
    fc1 [H, I] + bias [I]              split I;  fc2 [I, H] split axis 0
    embed_tokens.embedding [V, H]      split axis 0 (vocab) when N divides V
    lm_head.kernel  [H, V]             split axis 1 (vocab) when N divides V
    everything else                    replicated (norms, biases of row-parallel
                                       layers, learned positions, OPT projections)
    KV pool [pages, 2, Hkv, page_size, D] split axis 2; int8/fp8 scales axis 2

A dimension N does not divide (intermediate size, vocabulary) is replicated
instead; KV heads must divide (``check_tensor_parallel`` names the sizes that
work). Multi-host runs (jax.distributed) live in ``pagedjax/multihost.py``.
No engine imports here.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "tp"

# (path regex, axis to split or None). Paths look like "layers/3/attn/qkv_proj/kernel".
# The first matching rule wins; unmatched parameters are replicated.
SHARDING_RULES: tuple[tuple[str, int | None], ...] = (
    (r"attn/qkv_proj/kernel$", 1),
    (r"attn/qkv_proj/bias$", 0),
    (r"attn/o_proj/kernel$", 0),
    (r"attn/o_proj/bias$", None),
    (r"mlp/gate_up/kernel$", 2),
    (r"mlp/down/kernel$", 0),
    (r"mlp/down/bias$", None),
    (r"mlp/fc1/kernel$", 1),
    (r"mlp/fc1/bias$", 0),
    (r"mlp/fc2/kernel$", 0),
    (r"mlp/fc2/bias$", None),
    (r"^embed_tokens/embedding$", 0),
    (r"^lm_head/kernel$", 1),
)


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


def param_spec(path: str, shape: tuple[int, ...], tp: int) -> P:
    """The PartitionSpec of one parameter (see SHARDING_RULES)."""
    for pattern, axis in SHARDING_RULES:
        if re.search(pattern, path):
            if axis is None or tp == 1 or axis >= len(shape) or shape[axis] % tp:
                return P()
            spec = [None] * len(shape)
            spec[axis] = AXIS
            return P(*spec)
    return P()


def param_specs(tree, tp: int):
    """A pytree of PartitionSpecs matching ``tree`` (numpy or jax arrays)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, a: param_spec(path_str(p), tuple(a.shape), tp), tree)


def shard_params(tree, mesh: Mesh, dtype):
    """Host numpy tree -> jax arrays laid out by ``param_specs``.

    Each device receives only its slice (``jax.make_array_from_callback`` asks
    for the addressable shards only), so a device never holds a whole tensor
    that is split, and another process's shards are never materialised here.
    """
    tp = mesh.devices.size
    np_dtype = np.dtype(jnp.dtype(dtype))
    specs = param_specs(tree, tp)

    def put(arr, spec):
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(
            tuple(arr.shape), sharding,
            lambda idx: np.ascontiguousarray(np.asarray(arr[idx]), dtype=np_dtype))

    return jax.tree_util.tree_map(put, tree, specs)


def load_sharded(model: str | None, dtype="auto", tp: int = 1, devices=None):
    """-> (model, params, mesh): ``models.load_model`` with weights loaded into shards."""
    import models
    from models import loader

    resolved = models.resolve_model(model)
    m = models.build_model(resolved, dtype)
    check_tensor_parallel(m.info, tp, len(devices) if devices is not None else None)
    mesh = make_mesh(tp, devices)
    if resolved.gguf_file:
        ckpt = loader.open_gguf(os.path.join(resolved.path, resolved.gguf_file))
    else:
        ckpt = loader.open_hf_folder(resolved.path, resolved.hf_config)
    tree = m.params_from_hf(ckpt.get)  # host numpy (memory-mapped where the format allows)
    params = shard_params(tree, mesh, m.dtype)
    del tree
    return m, params, mesh


def kv_shardings(mesh: Mesh):
    """(pages sharding, scales sharding) of one layer of the KV pool."""
    return (NamedSharding(mesh, P(None, None, AXIS, None, None)),
            NamedSharding(mesh, P(None, None, AXIS, None)))


def allocate_sharded_kv(model, mesh: Mesh, num_pages: int, page_size: int, kv_cache_dtype=None):
    """One (pages, scales|None) pair per layer, created directly in its shards."""
    import kernels_pallas

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
    return tuple((zeros(), ones() if quant else None) for _ in range(info.num_layers))


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
