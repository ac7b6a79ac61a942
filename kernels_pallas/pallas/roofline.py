"""Rooflines: the bytes and FLOPs an attention launch or a decode step must move
and do, and the time that takes at a chip's peak bandwidth and compute.

Attention (one launch of the ragged paged kernel): every visible key and
value row of every KV head is read once per query tile (the kernels read a
KV head's rows once for all ``G`` query heads of its group), plus the int8 /
fp8 scales, the queries and the output. FLOPs: ``4 * D`` per (query head,
visible key) pair (``QK^T`` and ``PV``), causal within each sequence.

Decode step of a model: the weights once (the embedding table only when it
is also the LM head), the attention of every layer, the new K/V rows
written; FLOPs ``2 * params`` per token plus attention. Expected time is
``max(bytes / bandwidth, flops / peak)`` per chip (under tensor parallelism
each chip moves ``1/tp`` of it). Peaks are the vendors' datasheet figures
(dense bf16).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    hbm_bytes: int


CHIPS = {
    "H100": Chip("H100 SXM", 3.35e12, 989e12, 80 << 30),
    "H200": Chip("H200", 4.8e12, 989e12, 141 << 30),
    "A100": Chip("A100 80GB", 2.039e12, 312e12, 80 << 30),
    "v5e": Chip("TPU v5e", 819e9, 197e12, 16 << 30),
    "v6e": Chip("TPU v6e", 1640e9, 918e12, 32 << 30),
}


@dataclasses.dataclass(frozen=True)
class Cost:
    bytes: float
    flops: float

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.bytes + other.bytes, self.flops + other.flops)

    def scale(self, k: float) -> "Cost":
        return Cost(self.bytes * k, self.flops * k)

    def seconds(self, chip: Chip, tp: int = 1) -> float:
        """Time at the roofline of ``chip``, the work split evenly over ``tp`` chips."""
        return max(self.bytes / chip.hbm_bytes_per_s, self.flops / chip.bf16_flops_per_s) / tp


def attention(q_lens: Sequence[int], kv_lens: Sequence[int], *, hq: int, hkv: int, d: int,
              kv_itemsize: int, q_itemsize: int = 2, quantized: bool = False,
              window: int | None = None) -> Cost:
    """One launch over sequences with ``q_lens`` new tokens and ``kv_lens``
    context (new tokens included)."""
    kv_row = hkv * d * kv_itemsize + (hkv * 4 if quantized else 0)  # one token's K (or V)
    nbytes = 0.0
    pairs = 0.0  # (query token, visible key) pairs
    for ql, kl in zip(q_lens, kv_lens):
        first = kl - ql  # position of the first new token
        lo = 0 if window is None else max(0, first - window + 1)
        nbytes += 2 * kv_row * (kl - lo)
        if window is None:  # query i sees first + i + 1 keys
            pairs += ql * first + ql * (ql + 1) / 2
        else:
            pairs += sum(min(first + i + 1, window) for i in range(ql))
    t = sum(q_lens)
    nbytes += 2 * t * hq * d * q_itemsize  # queries in, output out
    return Cost(nbytes, 4.0 * hq * d * pairs)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What a decode step's cost depends on."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    hq: int
    hkv: int
    head_dim: int
    vocab: int
    tied: bool
    weight_itemsize: int = 2

    def matmul_params(self) -> int:
        """Parameters every token multiplies with (the embedding lookup excluded)."""
        h, d = self.hidden, self.head_dim
        per_layer = h * (self.hq + 2 * self.hkv) * d + self.hq * d * h + 3 * h * self.intermediate
        return self.layers * per_layer + self.vocab * h

    def weight_bytes_read(self) -> int:
        return self.matmul_params() * self.weight_itemsize


SMOLLM2_135M = ModelShape("SmolLM2-135M", 30, 576, 1536, 9, 3, 64, 49152, True)
LLAMA_8B = ModelShape("Llama-3-8B-shaped", 32, 4096, 14336, 32, 8, 128, 128256, False)


def decode_step(m: ModelShape, batch: int, ctx: int, kv_itemsize: int = 2) -> Cost:
    """One decode step: ``batch`` rows, each with ``ctx`` tokens of context."""
    att = attention([1] * batch, [ctx] * batch, hq=m.hq, hkv=m.hkv, d=m.head_dim,
                    kv_itemsize=kv_itemsize, quantized=kv_itemsize == 1)
    kv_write = batch * 2 * m.hkv * m.head_dim * kv_itemsize
    weights = Cost(m.weight_bytes_read(), 2.0 * m.matmul_params() * batch)
    return weights + (att + Cost(kv_write, 0.0)).scale(m.layers)


def routed_rows(tokens: int, experts: int, top_k: int) -> list[int]:
    """Rows per expert of ``tokens`` routed evenly: ``tokens * top_k`` rows over
    the experts, one expert per row while there are fewer rows than experts."""
    rows = tokens * top_k
    if rows <= experts:
        return [1] * rows
    return [rows // experts + (e < rows % experts) for e in range(experts)]


def grouped_matmul(rows_per_group: Sequence[int], k: int, n: int, *, block: int = 16,
                   itemsize: int = 2) -> Cost:
    """One blocked grouped-matmul launch (kernels_pallas/pallas/grouped_matmul.py):
    every block of ``block`` rows reads its expert's whole ``[K, N]`` weight (so an
    expert with up to ``block`` rows is read once), the rows once and the output
    once; FLOPs count the padded rows the blocks multiply."""
    blocks = sum(-(-r // block) for r in rows_per_group if r > 0)
    rows = sum(rows_per_group)
    nbytes = blocks * k * n * itemsize + rows * (k + n) * itemsize
    return Cost(float(nbytes), 2.0 * blocks * block * k * n)
