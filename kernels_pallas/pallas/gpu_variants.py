"""The Triton kernel variants the engine can launch, as abstract calls.

A variant is the shared attention axes (:mod:`variant_axes`: decode or
mixed, head size, GQA group, page dtype, page size, window, soft cap) plus
the Triton kernel's own knobs: KV splits (one, or several: flash-decoding)
and the block sizes, warps and pipeline stages (None: the kernel's own
choice, :func:`triton_plan.plan` and ``triton_plan.NUM_WARPS``). Queries
are bf16, as the engine runs models on a GPU. :func:`call` returns a
function and ``jax.ShapeDtypeStruct`` arguments for :mod:`gpu_compile`.

:func:`full_matrix` is every combination; :func:`representative` a subset
that still has each value of each axis and the heaviest combinations (the
mixed tiles with the largest heads, quantized pages, window and soft cap).
"""

from __future__ import annotations

import dataclasses

from pagedjax.kernels_pallas.pallas import triton_gpu, triton_plan
from pagedjax.kernels_pallas.pallas import variant_axes as va
from pagedjax.kernels_pallas.pallas.variant_axes import (  # noqa: F401 - the axes, re-exported
    GROUPS, HEAD_DIMS, KINDS, PAGE_DTYPES, PAGE_SIZES, SOFT_CAP, WINDOW)

SPLITS = (1, 4)


@dataclasses.dataclass(frozen=True)
class GpuVariant(va.Variant):
    kv_splits: int = 1
    block_k: int | None = None  # None: the kernel's own choice (plan())
    num_warps: int | None = None  # None: the kernel's own choice
    num_stages: int | None = None  # None: the kernel's own choice
    block_q: int | None = None  # None: the kernel's own choice

    @property
    def label(self) -> str:
        bk = f" bk{self.block_k}" if self.block_k else ""
        tune = "".join(f" {k}{v}" for k, v in (("bq", self.block_q), ("w", self.num_warps),
                                                 ("st", self.num_stages)) if v)
        return f"{self.base_label} s{self.kv_splits}{bk}{tune}"

    @property
    def step_key(self) -> tuple:
        """The fields :data:`triton_plan.HALF_BLOCK` matches."""
        return (self.kind, self.head_dim, self.group, self.page_dtype, self.page_size,
                self.window, self.soft_cap, self.kv_splits > 1)

    def plan(self):
        """The kernel's static plan for this variant: (BQ, M, BK, tiles, splits)."""
        return triton_plan.plan(self.tokens, self.seqs, self.group * self.num_kv_heads,
                                self.num_kv_heads, self.head_dim, self.page_size,
                                self.pages_per_seq, 1 if self.kind == "decode" else None,
                                self.block_q, self.block_k, self.kv_splits,
                                page_dtype=self.page_dtype, window=self.window,
                                soft_cap=self.soft_cap)


def call(v: GpuVariant):
    """(fn, args): the dispatcher-level kernel call of ``v`` on abstract arrays."""
    tuning = {k: getattr(v, k) for k in ("num_warps", "num_stages") if getattr(v, k)}

    def fn(q, kv, kv_lens, page_table, cu_q_lens, num_seqs, scales=None):
        return triton_gpu.ragged_paged_attention(
            q, kv, kv_lens, page_table, cu_q_lens, num_seqs, kv_scales=scales,
            block_k=v.block_k, block_q=v.block_q, kv_splits=v.kv_splits,
            **v.attention_kwargs(), **tuning)

    return fn, v.abstract_args()


def full_matrix() -> list[GpuVariant]:
    """Every combination of the axes above, one KV split and several."""
    return [GpuVariant(**axes, kv_splits=sp) for axes in va.product() for sp in SPLITS]


def representative() -> list[GpuVariant]:
    """Each value of every axis at least once, plus the heaviest variants."""
    out = [GpuVariant("mixed", d, 4, dt, 16, True, True, 1)
           for d in HEAD_DIMS for dt in PAGE_DTYPES]  # heaviest: mixed, all features
    out += [GpuVariant("decode", d, g, "bfloat16", 16, False, False, 4)
            for d, g in ((64, 3), (128, 1), (128, 8), (256, 2))]
    out += [GpuVariant("decode", 128, 7, "int8", ps, True, False, 1) for ps in (64, 128)]
    out += [GpuVariant("mixed", 64, 3, "bfloat16", 16, False, True, 4),
            GpuVariant("mixed", 128, 7, "float8_e4m3fn", 128, False, False, 1)]
    return out


def step_table() -> list[GpuVariant]:
    """The variants of the matrix whose key block the plan halves (the step table)."""
    return [v for v in full_matrix() if triton_plan.halves_block(v.step_key)]


def unsupported(v: GpuVariant, arch: str) -> str | None:
    """Why the hardware of ``arch`` cannot run ``v`` at all, or None."""
    if v.page_dtype == "float8_e4m3fn" and arch == "sm_80":
        return "no fp8 on the A100 (conversions need compute capability >= 8.9)"
    return None
