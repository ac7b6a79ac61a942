"""The engine's step compiled for a TPU that is not there (device-less, ahead of time).

With ``libtpu`` installed, ``jax.experimental.topologies`` describes a TPU
slice (``"v5e:1x1"``, ``"v6e:2x2"``, ...) by compile-only devices, and
``jax.jit(...).lower(...).compile()`` runs libtpu's real compiler for them on
any host. :func:`abstract_runner` builds the engine's :class:`Runner` over
such devices with shape-only weights and KV pool (``jax.ShapeDtypeStruct``
with the engine's shardings: the mesh and ``shard_map`` for tensor
parallelism), and :func:`compile_step` compiles the programs one engine step
runs (the model with the Mosaic kernel, the sampler, the page copies) and
returns the compiler's memory analysis of each.

The programs are those the engine runs on a TPU: same runner, same plan,
except that the attention call is told ``interpret=False`` (on this CPU host
``interpret=None`` would pick the TPU interpreter).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from pagedjax.kernels_pallas.pallas.tpu_compile import on_device, tpu_devices  # noqa: F401
from pagedjax.models.base import ExecutionPlan
from pagedjax.worker.plan import kv_cache_bytes_per_page
from pagedjax.worker import programs
from pagedjax.worker.runner import Runner


def _native_attention(mesh):
    from pagedjax import kernels_pallas

    fn = (kernels_pallas.sharded_attention(mesh) if mesh is not None
          else kernels_pallas.ragged_paged_attention)
    return functools.partial(fn, interpret=False)


def abstract_params(model, mesh: Mesh | None, device) -> dict:
    """The model's state as ``ShapeDtypeStruct`` leaves placed as the engine places them."""
    from flax import nnx

    from pagedjax.distributed.sharding import param_specs

    flat = nnx.to_flat_state(model.abstract_state)
    specs = nnx.traversals.flatten_mapping(param_specs(model, mesh.devices.size)) if mesh else {}
    single = jax.sharding.SingleDeviceSharding(device)
    leaves = {}
    for path, v in flat:
        sh = NamedSharding(mesh, specs[tuple(path)]) if mesh is not None else single
        leaves[tuple(path)] = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh)
    return nnx.traversals.unflatten_mapping(leaves)


def abstract_kv(model, num_pages: int, page_size: int, kv_dtype, mesh, device) -> tuple:
    """One (pages, scales|None) pair of ``ShapeDtypeStruct`` per layer."""
    from pagedjax.distributed.sharding import kv_shardings
    from pagedjax.kernels_pallas import is_quantized

    info = model.info
    if mesh is not None:
        pages_sh, scales_sh = kv_shardings(mesh)
    else:
        pages_sh = scales_sh = jax.sharding.SingleDeviceSharding(device)
    shape = (num_pages, 2, info.num_kv_heads, page_size, info.head_dim)
    pages = jax.ShapeDtypeStruct(shape, jnp.dtype(kv_dtype), sharding=pages_sh)
    scales = (jax.ShapeDtypeStruct(shape[:4], jnp.float32, sharding=scales_sh)
              if is_quantized(kv_dtype) else None)
    return tuple((pages, scales) for _ in range(info.num_layers))


def abstract_runner(model, devices: list, *, tp: int = 1, num_pages: int, page_size: int = 16,
                    max_num_seqs: int = 64, max_num_batched_tokens: int = 512,
                    max_model_len: int = 2048, kv_dtype=None) -> Runner:
    """A :class:`Runner` over ``devices`` (the first ``tp``) with shape-only state."""
    if tp > len(devices):
        raise ValueError(f"tp: {tp} exceeds the {len(devices)} devices of the target")
    mesh = None
    if tp > 1:
        from pagedjax.distributed.sharding import AXIS, check_tensor_parallel

        check_tensor_parallel(model.info, tp, len(devices))
        mesh = Mesh(devices[:tp], (AXIS,))
    kv_dtype = model.dtype if kv_dtype is None else jnp.dtype(kv_dtype)
    params = abstract_params(model, mesh, devices[0])
    kv = abstract_kv(model, num_pages, page_size, kv_dtype, mesh, devices[0])
    plan = ExecutionPlan(attn_backend="pallas_tpu", mesh=mesh,
                         attention_fn=_native_attention(mesh))
    return Runner(model, params, kv, page_size=page_size, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                  plan=plan, sample_backend="xla")  # the draw on a TPU


@dataclasses.dataclass
class ProgramMemory:
    """The compiler's memory analysis of one program, bytes per chip."""

    program: str
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int

    @classmethod
    def of(cls, program: str, compiled: Any) -> "ProgramMemory":
        m = compiled.memory_analysis()
        return cls(program, m.argument_size_in_bytes, m.output_size_in_bytes,
                   m.alias_size_in_bytes, m.temp_size_in_bytes, m.generated_code_size_in_bytes)


def per_chip_bytes(tree) -> int:
    """Bytes of ``tree``'s ``ShapeDtypeStruct`` leaves one chip holds."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += jnp.dtype(leaf.dtype).itemsize * math.prod(shape)
    return total


def kv_bytes_per_page_per_chip(model, page_size: int, kv_dtype, tp: int) -> int:
    """One KV page of every layer, on one chip (KV heads split over ``tp``)."""
    per = kv_cache_bytes_per_page(model.info, page_size, kv_dtype) // tp
    if jnp.dtype(kv_dtype).itemsize == 1:  # f32 scale per token, head, K/V
        per += model.info.num_layers * page_size * 2 * (model.info.num_kv_heads // tp) * 4
    return per


def compile_step(runner: Runner, device, *, decode_rows: int = 64, mixed_tokens: int = 512,
                 pages: int | None = None, kinds=("decode", "mixed")) -> list[ProgramMemory]:
    """Compile a decode step (``decode_rows`` rows) and a mixed step
    (``mixed_tokens`` tokens) of ``runner`` with their sampler and page-copy
    programs; the memory analysis of each. Any compile or partitioning error
    propagates."""
    from pagedjax.sample.sampler import RowState, build_sampling_tensors
    from pagedjax.sampling_params import SamplingParams
    from pagedjax.worker.inputs import SampleRow, pow2
    from pagedjax.worker.warmup import dummy_rows

    buckets = runner.buckets
    p = pages or buckets.p_buckets()[-1]
    greedy = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=1, logprobs=5)
    out = []
    with on_device(device):
        for name, (s, t, decode) in (("decode", (decode_rows, decode_rows, True)),
                                     ("mixed", (8, mixed_tokens, False))):
            if name not in kinds:
                continue
            rows = dummy_rows(buckets, s, t, p, decode)
            if rows is None:
                raise ValueError(f"{name}: no step has {s} rows, {t} tokens, {p} pages")
            srows = [SampleRow(r.request_id, i, RowState(greedy, [0], []), None)
                     for i, r in enumerate(rows)]
            _, job = programs.model_compile_job(runner, rows, srows)
            out.append(ProgramMemory.of(f"model {name} S{s} T{t} P{p}", job()))
        r = pow2(decode_rows, 8)
        st = build_sampling_tensors([RowState(greedy, [0], [])], r, runner.vocab_size,
                                    runner.max_model_len)
        _, job = programs.sampler_compile_job(runner, decode_rows, st, 8)
        out.append(ProgramMemory.of(f"sampler R{r} top-p logprobs", job()))
        _, job = programs.copy_compile_job(runner, 8)
        out.append(ProgramMemory.of("page copy x8", job()))
    return out
