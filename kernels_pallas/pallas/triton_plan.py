"""The Triton attention kernel's static plan: tile rows, key block, KV splits, warps.

:func:`plan` fixes, per launch, the query rows of a tile (``BQ``, and ``M``
rows per dot operand), the keys per block (``BK``) and the KV splits; every
program runs on :data:`NUM_WARPS` warps with 2 pipeline stages. The choices
are register headroom, checked by compiling every variant for sm_90a and
sm_80 (kernels_pallas/pallas/gpu_compile.py, docs/compile_checks.md).

Tiles. The K/V tiles are gathered through tensors of pointers (one 64-bit
address per vector until the load), so registers per thread grow with
``BK * D`` and ``M * D`` over the threads of a block:

* mixed tiles of ``M = 64`` rows on 4 warps used 242-255 registers at
  ``D = 128`` and spilled at ``D = 256``: hence tiles of at most 32 rows;
* with 4-warp blocks, ptxas spilled 4-36 B in some variants at exactly 96,
  128 or 168 registers. Those are *occupancy steps*: the most registers at
  which one more block still fits on an SM (65,536 / (threads x r)). When a
  kernel needs a few registers more than a step, ptxas caps it at the step
  and spills the rest (ptxas 12 for sm_80 does it with any flags; ptxas 13
  for sm_90a with triton's ``--regAllocOptLevel=2``). It is not register
  pressure, and ``maxnreg``, which would pin the count, is not a Pallas
  Triton compiler parameter (JAX 0.10 and 0.11 pass only warps and stages
  to XLA's Triton call); the remedy is to keep each tile's count away from
  steps. Steps are dense for 4-warp blocks (64, 72, 80, 96, 128, 168) and
  sparse for 8-warp blocks (64, 80, 128: 4, 3 and 2 blocks per SM).

So every program runs on ``NUM_WARPS = 8``; mixed tiles hold ``M = 32`` query
rows (``BQ = 32 // G``) at ``D <= 64`` and 16 rows above, like decode tiles;
``BK`` = 64 keys (32 at ``D = 256``). Every tile then needs at most 128
registers (at least 127 spare) and gets 2 blocks of 8 warps per SM (25%
occupancy; 3-4 blocks where it needs 80 or fewer). The cost: at ``D >= 128``
a prefill chunk's keys are read once per 16 query rows (from L2 mostly).

Step table. Even on 8 warps, about 2 in 100 variants of the matrix still
needed a few registers more than the 64-, 80- or 128-register step and
spilled 4-16 B there (on sm_90a; one family on sm_80). :data:`HALF_BLOCK`
lists them, found by compiling the variant matrix
(``benchmarks/kernel_bench/gpu_compile_check.py --set full``), a row per
variant or per family (a row with wildcards, every member compiled). For
those the key block is halved (``BK`` 64 -> 32, or 32 -> 16 at ``D = 256``):
that takes each under its step or keeps it at the step with no spill, with
the same 8 warps and 2 pipeline stages, at the price of twice the loop trips
over the keys. Occupancy stays or grows, except where a spilling kernel had
squeezed into one more block (38% -> 25%: BENCHMARKS.md lists them). Halving
the block was chosen over one pipeline stage (which also removes these
spills) because it keeps the loads pipelined. The KV splits are chosen with
the default block, before the table is read.
"""

from __future__ import annotations

import math

# Query rows of a mixed tile (BQ * G, rounded up to a power of two) by head size,
# and warps per program: register headroom (module docstring).
_SMALL_HEAD, _SMALL_HEAD_ROWS = 64, 32  # larger heads: 16 rows, as decode tiles
_TILE_ROWS = 16
NUM_WARPS = 8
NUM_STAGES = 2
# Programs wanted in flight for a decode step: ~2 waves on an H100/H200.
_TARGET_PROGRAMS = 264
_MAX_SPLITS = 16

# Variants whose default key block sits a few registers over an occupancy step (module
# docstring; on sm_90a, one family on sm_80), with the step they spilled at, as
# patterns of (tiles, head size, GQA group, page dtype, page size, sliding window,
# soft cap, several KV splits); tiles are "decode" (one query row of one sequence) or
# "mixed"; None matches every value: a family checked whole (some members spilled,
# the others sat within 6 registers of the same step; every member compiles without a
# spill with the halved block). Their key block is halved.
HALF_BLOCK = (
    (None, 256, None, "float8_e4m3fn", 16, True, True, None),  # 128 registers
    (None, 128, None, "bfloat16", 128, True, None, False),  # 80
    (None, 128, None, "bfloat16", 64, None, None, True),  # 80
    (None, 128, None, "bfloat16", 16, False, False, True),  # 80
    (None, 128, 8, "int8", 128, True, False, False),  # 80
    ("decode", 64, None, "bfloat16", 64, False, None, True),  # 64
    (None, 256, None, "int8", 16, True, True, None),  # 128
    ("decode", 64, None, "int8", 16, False, None, True),  # 80 on sm_80
)


def matches(row: tuple, key: tuple) -> bool:
    """Whether a variant's ``key`` (the fields of :data:`HALF_BLOCK`) matches ``row``."""
    return all(p is None or p == k for p, k in zip(row, key, strict=True))


def halves_block(key: tuple) -> bool:
    """Whether a variant's ``key`` matches a row of :data:`HALF_BLOCK`."""
    return any(matches(row, key) for row in HALF_BLOCK)


def next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def chunk_geometry(page_size: int, block_k: int) -> tuple[int, int, int]:
    """How a ``block_k``-key block maps onto pages: ``(R, chunks_per_page, PPB)``.

    A chunk is ``R`` rows of one page read as one dense tile; a block is
    ``PPB`` consecutive chunks (``PPB * R == block_k``). Pages of at most
    ``block_k`` tokens are one chunk each (``R = next_pow2(page_size)``);
    larger pages are cut into ``ceil(page_size / block_k)`` chunks of
    ``R = block_k`` rows and a block is one chunk.
    """
    r = next_pow2(page_size)
    if r <= block_k:
        return r, 1, block_k // r
    return block_k, -(-page_size // block_k), 1


def mixed_rows(d: int) -> int:
    """Query rows (``BQ * G``) of a mixed tile at head size ``d``."""
    return _SMALL_HEAD_ROWS if d <= _SMALL_HEAD else _TILE_ROWS


def default_block_k(d: int, ctx: int) -> int:
    """Keys per block at head size ``d`` for contexts of at most ``ctx`` tokens."""
    return max(16, min(64 if d <= 128 else 32, next_pow2(ctx)))


def plan(t: int, s: int, hq: int, hkv: int, d: int, page_size: int, pages_per_seq: int,
         max_q_len: int | None, block_q=None, block_k=None, kv_splits=None, *,
         page_dtype: str | None = None, window: bool = False, soft_cap: bool = False):
    """Static block sizes: (BQ, M, BK, num_tiles, kv_splits).

    ``page_dtype`` (the pool's dtype name), ``window`` and ``soft_cap`` pick the
    variant's row of :data:`HALF_BLOCK` when the key block is the default.
    """
    g = hq // hkv
    if block_q is None:
        bound = t if max_q_len is None else min(max_q_len, t)
        block_q = 1 if bound <= 1 else max(1, min(bound, mixed_rows(d) // g))
    m_rows = next_pow2(max(block_q * g, _TILE_ROWS))
    num_tiles = t if block_q == 1 else min(t, -(-t // block_q) + s)
    num_tiles = max(num_tiles, 1)
    default_k = block_k is None
    if default_k:
        block_k = default_block_k(d, pages_per_seq * page_size)
    elif block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_k: must be a power of two >= 16, got {block_k}")
    if kv_splits is None:
        _, nsub, ppb = chunk_geometry(page_size, block_k)
        blocks = -(-pages_per_seq * nsub // ppb)  # blocks of the longest possible context
        want = -(-_TARGET_PROGRAMS // (num_tiles * hkv))
        kv_splits = max(1, min(want, blocks, _MAX_SPLITS))
    kind = "decode" if block_q == 1 else "mixed"
    if default_k and block_k > 16 and halves_block(
            (kind, d, g, page_dtype, page_size, bool(window), bool(soft_cap), kv_splits > 1)):
        block_k //= 2
    return block_q, m_rows, block_k, num_tiles, kv_splits
