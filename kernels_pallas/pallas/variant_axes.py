"""The axes of a paged-attention kernel variant, shared by the GPU and TPU checks.

A variant fixes everything that reaches a compiled attention kernel: a decode
step (``max_q_len=1``) or a mixed one (prefill chunks and decode rows), the
head size, the GQA group ``G = Hq / Hkv``, the page dtype (the model's bf16,
or an int8 / fp8 cache with f32 scales), the page size, sliding window and
logit soft cap. :class:`Variant` holds those axes and builds the abstract
arguments and attention keywords of one launch; the Triton variants
(:mod:`gpu_variants`: KV splits, block sizes, warps) and the Mosaic ones
(:mod:`tpu_compile`: pages per block) add their platform's own knobs.
:func:`product` is the cross product of the axes, or of a subset of them.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp

KINDS = ("decode", "mixed")
HEAD_DIMS = (64, 128, 256)
GROUPS = (1, 2, 3, 4, 7, 8)  # 3: the default model (9 / 3 heads); 7: 28 / 4 heads
PAGE_DTYPES = ("bfloat16", "int8", "float8_e4m3fn")
PAGE_SIZES = (16, 64, 128)  # below, at, above the Triton kernel's 64-key block
FEATURES = ((False, False), (False, True), (True, False), (True, True))  # (window, soft cap)
WINDOW = 4096
SOFT_CAP = 50.0


@dataclasses.dataclass(frozen=True)
class Variant:
    kind: str = "decode"
    head_dim: int = 128
    group: int = 1
    page_dtype: str = "bfloat16"
    page_size: int = 16
    window: bool = False
    soft_cap: bool = False
    # Abstract batch: big enough that the kernels' defaults are the engine's
    # (a 512-token mixed bucket of 16 sequences; 64 decode rows), 64 pages each.
    num_kv_heads: int = dataclasses.field(default=2, kw_only=True)
    pages_per_seq: int = dataclasses.field(default=64, kw_only=True)

    @property
    def base_label(self) -> str:
        feats = "+".join(f for f, on in (("window", self.window), ("softcap", self.soft_cap))
                         if on) or "-"
        return (f"{self.kind} d{self.head_dim} g{self.group} {self.page_dtype} "
                f"ps{self.page_size} {feats}")

    @property
    def tokens(self) -> int:
        return 64 if self.kind == "decode" else 512

    @property
    def seqs(self) -> int:
        return 64 if self.kind == "decode" else 16

    @property
    def quantized(self) -> bool:
        return self.page_dtype != "bfloat16"

    def abstract_args(self, sharding=None) -> list:
        """``jax.ShapeDtypeStruct`` arguments of one launch: q, kv_pages, kv_lens,
        page_table, cu_q_lens, num_seqs and (quantized pages) kv_scales."""
        t, s, hkv, d, ps = self.tokens, self.seqs, self.num_kv_heads, self.head_dim, self.page_size
        n = s * self.pages_per_seq + 1

        def sds(shape, dtype):
            return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding)

        args = [sds((t, self.group * hkv, d), jnp.bfloat16),
                sds((n, 2, hkv, ps, d), self.page_dtype), sds((s,), jnp.int32),
                sds((s, self.pages_per_seq), jnp.int32), sds((s + 1,), jnp.int32),
                sds((1,), jnp.int32)]
        if self.quantized:
            args.append(sds((n, 2, hkv, ps), jnp.float32))
        return args

    def attention_kwargs(self) -> dict:
        """The keywords every backend's ``ragged_paged_attention`` takes for it."""
        return dict(sm_scale=self.head_dim ** -0.5,
                    sliding_window=WINDOW if self.window else None,
                    soft_cap=SOFT_CAP if self.soft_cap else None,
                    max_q_len=1 if self.kind == "decode" else None)


def product(kinds: Sequence[str] = KINDS, head_dims: Sequence[int] = HEAD_DIMS,
            groups: Sequence[int] = GROUPS, page_dtypes: Sequence[str] = PAGE_DTYPES,
            page_sizes: Sequence[int] = PAGE_SIZES,
            features: Sequence[tuple[bool, bool]] = FEATURES) -> Iterator[dict]:
    """The axes' cross product (or of the values given), as keyword dicts."""
    for kind, d, g, dt, ps, (w, c) in itertools.product(
            kinds, head_dims, groups, page_dtypes, page_sizes, features):
        yield dict(kind=kind, head_dim=d, group=g, page_dtype=dt, page_size=ps, window=w,
                   soft_cap=c)
