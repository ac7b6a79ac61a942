"""The Triton kernel variants the engine can launch, as abstract calls.

A variant fixes everything that reaches the compiled kernel: a decode step
(``max_q_len=1``: one query row per tile) or a mixed one (prefill chunks and
decode rows, ``max_q_len=None``: tiles of up to ``64 // G`` rows), the head
size, the GQA group ``G = Hq / Hkv``, the page dtype (the model's bf16, or an
int8 / fp8 cache with f32 scales), the page size, sliding window, logit soft
cap, and the block sizes (``block_k``; one KV split or several). Queries are
bf16, as the engine runs models on a GPU. :func:`call` returns a function and
``jax.ShapeDtypeStruct`` arguments for :mod:`gpu_compile`.

:func:`full_matrix` is every combination; :func:`representative` a subset
that still has each value of each axis and the heaviest combinations (the
mixed tiles with the largest heads, quantized pages, window and soft cap).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp

from pagedjax.kernels_pallas.pallas import triton_gpu

HEAD_DIMS = (64, 128, 256)
GROUPS = (1, 2, 3, 4, 7, 8)  # 3: the default model (9 / 3 heads); 7: 28 / 4 heads
PAGE_DTYPES = ("bfloat16", "int8", "float8_e4m3fn")
PAGE_SIZES = (16, 64, 128)  # below, at, above the 64-key block
KINDS = ("decode", "mixed")
WINDOW = 4096
SOFT_CAP = 50.0


@dataclasses.dataclass(frozen=True)
class GpuVariant:
    kind: str = "decode"
    head_dim: int = 128
    group: int = 1
    page_dtype: str = "bfloat16"
    page_size: int = 16
    window: bool = False
    soft_cap: bool = False
    kv_splits: int = 1
    block_k: int | None = None  # None: the kernel's own choice (plan())
    num_warps: int | None = None  # None: the kernel's own choice
    num_stages: int | None = None  # None: the kernel's own choice
    block_q: int | None = None  # None: the kernel's own choice

    # Abstract batch: big enough that the kernel's defaults are the engine's
    # (a 512-token mixed bucket; 64 decode rows), 64 pages of context each.
    num_kv_heads: int = 2
    pages_per_seq: int = 64

    @property
    def label(self) -> str:
        feats = "+".join(f for f, on in (("window", self.window), ("softcap", self.soft_cap))
                         if on) or "-"
        bk = f" bk{self.block_k}" if self.block_k else ""
        tune = "".join(f" {k}{v}" for k, v in (("bq", self.block_q), ("w", self.num_warps),
                                                 ("st", self.num_stages)) if v)
        return (f"{self.kind} d{self.head_dim} g{self.group} {self.page_dtype} "
                f"ps{self.page_size} {feats} s{self.kv_splits}{bk}{tune}")

    @property
    def tokens(self) -> int:
        return 64 if self.kind == "decode" else 512

    @property
    def seqs(self) -> int:
        return 64 if self.kind == "decode" else 16

    def plan(self):
        """The kernel's static plan for this variant: (BQ, M, BK, tiles, splits)."""
        return triton_gpu.plan(self.tokens, self.seqs, self.group * self.num_kv_heads,
                               self.num_kv_heads, self.head_dim, self.page_size,
                               self.pages_per_seq, 1 if self.kind == "decode" else None,
                               self.block_q, self.block_k, self.kv_splits)


def call(v: GpuVariant):
    """(fn, args): the dispatcher-level kernel call of ``v`` on abstract arrays."""
    t, s, hkv, d, ps = v.tokens, v.seqs, v.num_kv_heads, v.head_dim, v.page_size
    num_pages = s * v.pages_per_seq + 1
    quantized = v.page_dtype != "bfloat16"
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    args = [jax.ShapeDtypeStruct((t, v.group * hkv, d), jnp.bfloat16),
            jax.ShapeDtypeStruct((num_pages, 2, hkv, ps, d), jnp.dtype(v.page_dtype)),
            i32(s), i32(s, v.pages_per_seq), i32(s + 1), i32(1)]
    if quantized:
        args.append(jax.ShapeDtypeStruct((num_pages, 2, hkv, ps), jnp.float32))

    tuning = {k: getattr(v, k) for k in ("num_warps", "num_stages") if getattr(v, k)}

    def fn(q, kv, kv_lens, page_table, cu_q_lens, num_seqs, scales=None):
        return triton_gpu.ragged_paged_attention(
            q, kv, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=d ** -0.5,
            sliding_window=WINDOW if v.window else None,
            soft_cap=SOFT_CAP if v.soft_cap else None, kv_scales=scales,
            max_q_len=1 if v.kind == "decode" else None, block_k=v.block_k,
            block_q=v.block_q, kv_splits=v.kv_splits, **tuning)

    return fn, args


def full_matrix() -> list[GpuVariant]:
    """Every combination of the axes above, one KV split and several."""
    return [GpuVariant(kind, d, g, dt, ps, w, c, sp)
            for kind, d, g, dt, ps, w, c, sp in itertools.product(
                KINDS, HEAD_DIMS, GROUPS, PAGE_DTYPES, PAGE_SIZES, (False, True),
                (False, True), (1, 4))]


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


def unsupported(v: GpuVariant, arch: str) -> str | None:
    """Why the hardware of ``arch`` cannot run ``v`` at all, or None."""
    if v.page_dtype == "float8_e4m3fn" and arch == "sm_80":
        return "no fp8 on the A100 (conversions need compute capability >= 8.9)"
    return None
