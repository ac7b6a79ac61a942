"""The grouped-matmul kernel's launches for real expert shapes, as abstract calls.

A mixture-of-experts layer runs two grouped matmuls (models/moe.py): the
experts' gate and up projections (``K = hidden``, ``N = 2 * intermediate``)
and their down projection (``K = intermediate``, ``N = hidden``), over the
``tokens * top_k`` rows a step routes, regrouped into blocks of 16 rows of one
expert (``ceil(rows / 16) + min(experts, rows)`` blocks). :data:`SHAPES` holds
Qwen3-30B-A3B's and Mixtral-8x7B's experts and a tiny one; :func:`variants`
their launches for a 64-token decode step. :func:`call` gives ``(fn, args)``
of one launch for :mod:`gpu_compile` (``backend="triton"``);
:func:`compile_tpu` compiles one for a TPU chip with libtpu (:mod:`tpu_compile`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pagedjax.kernels_pallas.pallas import grouped_matmul as gm

HEADROOM_VMEM_LIMIT = int(0.8 * gm.VMEM_LIMIT)


@dataclasses.dataclass(frozen=True)
class ExpertShape:
    name: str
    hidden: int
    intermediate: int  # per expert
    experts: int
    top_k: int


TINY = ExpertShape("tiny", 64, 32, 4, 2)
QWEN3_30B_A3B = ExpertShape("Qwen3-30B-A3B", 2048, 768, 128, 8)
MIXTRAL_8X7B = ExpertShape("Mixtral-8x7B", 4096, 14336, 8, 2)
SHAPES = (TINY, QWEN3_30B_A3B, MIXTRAL_8X7B)


@dataclasses.dataclass(frozen=True)
class GmmVariant:
    model: str
    proj: str  # "gate_up" or "down"
    k: int
    n: int
    groups: int
    rows: int  # routed rows: tokens * top_k
    dtype: str = "bfloat16"
    block: int = 16
    bn: int | None = None  # None: the kernel's own choice (grouped_matmul.plan)
    bk: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    @property
    def blocks(self) -> int:
        return -(-self.rows // self.block) + min(self.groups, self.rows)

    @property
    def label(self) -> str:
        bn, bk = gm.plan(self.k, self.n, self.bn, self.bk)
        tune = "".join(f" {k}{v}" for k, v in (("w", self.num_warps), ("st", self.num_stages))
                       if v)
        return (f"{self.model} {self.proj} K{self.k} N{self.n} E{self.groups} "
                f"b{self.block} bn{bn} bk{bk}{tune}")


def variants(tokens: int = 64) -> list[GmmVariant]:
    """Both projections of every shape in :data:`SHAPES`, ``tokens`` routed tokens."""
    out = []
    for s in SHAPES:
        rows = tokens * s.top_k
        out.append(GmmVariant(s.name, "gate_up", s.hidden, 2 * s.intermediate, s.experts, rows))
        out.append(GmmVariant(s.name, "down", s.intermediate, s.hidden, s.experts, rows))
    return out


def call(v: GmmVariant, backend: str, sharding=None):
    """(fn, args): one ``block_matmul`` launch of ``v`` on abstract arrays."""
    dt = jnp.dtype(v.dtype)
    args = [jax.ShapeDtypeStruct((v.blocks * v.block, v.k), dt, sharding=sharding),
            jax.ShapeDtypeStruct((v.groups, v.k, v.n), dt, sharding=sharding),
            jax.ShapeDtypeStruct((v.blocks,), jnp.int32, sharding=sharding)]
    tune = {k: getattr(v, k) for k in ("num_warps", "num_stages") if getattr(v, k)}

    def fn(xp, w, block_group, vmem_limit_bytes=HEADROOM_VMEM_LIMIT):
        return gm.block_matmul(xp, w, block_group, block=v.block, backend=backend, bn=v.bn,
                               bk=v.bk, vmem_limit_bytes=vmem_limit_bytes, **tune)

    return fn, args


def compile_tpu(v: GmmVariant, chip: str = "v5e",
                vmem_limit_bytes: int = HEADROOM_VMEM_LIMIT):
    """libtpu's compiled executable of ``v`` (Mosaic) on one ``chip``; any Mosaic
    or XLA error (a VMEM overflow included) propagates."""
    from jax.sharding import SingleDeviceSharding

    from pagedjax.kernels_pallas.pallas import tpu_compile as tc

    device = tc.tpu_devices(f"{chip}:1x1")[0]
    fn, args = call(v, "mosaic", SingleDeviceSharding(device))
    with tc.on_device(device):
        return jax.jit(lambda *a: fn(*a, vmem_limit_bytes=vmem_limit_bytes)).lower(
            *args).compile()
