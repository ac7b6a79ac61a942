"""KV groups: a model's layers split by attention type, one page table per group (no JAX).

A hybrid-attention model (Gemma 3: five sliding-window layers per global one)
needs the whole context only in its full-attention layers; a sliding-window
layer of window W reads the last W keys of each query and nothing before.
Giving every layer pages for the whole context wastes most of the pool at long
contexts, so the layers are split into *KV groups* by attention type (full, or
sliding window W) and each group gets its own page table per sequence.

Equal-sized groups share one pool (vLLM's hybrid allocator does the same):
every group has at most ``num_slots`` layers, the pool holds ``num_slots``
arrays ``[num_pages, 2, Hkv, page_size, D]``, and layer k of any group keeps
its K/V in array k. A page id belongs to one group at a time (it is allocated
from the one free list), so page p of array k holds layer k of whichever group
owns p. The group size is the smallest count of layers of one type; a type
whose count is not a multiple of it gets a last, shorter group (its pages
leave the arrays past its layers unused).

A sliding-window group's table keeps every logical page index: entries of
pages that no query can see any more hold ``NULL_PAGE`` (0), and the kernels
never read them (each kernel starts a query tile's keys at its window's first
position and zeroes V outside ``[window start, kv_len)``).

``plan_layout(windows, hybrid)`` builds the layout from each layer's window
(None: full attention). With ``hybrid=False`` (or only full-attention layers)
there is one full group holding every layer in its own array: the uniform
pool. A model whose layers all share one window is one sliding group.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from pagedjax.utils import cdiv


@dataclasses.dataclass(frozen=True)
class KVGroup:
    window: int | None      # sliding window in tokens; None: full attention
    layers: tuple[int, ...]  # the model's layer indices, in order

    def first_key(self, pos: int) -> int:
        """The first position a query at ``pos`` reads."""
        return 0 if self.window is None else max(0, pos - self.window + 1)

    def max_pages(self, num_tokens: int, page_size: int, chunk: int) -> int:
        """The most pages one sequence of ``num_tokens`` holds at once in this group,
        prompt chunks of up to ``chunk`` tokens included."""
        whole = cdiv(num_tokens, page_size)
        if self.window is None:
            return whole
        return min(whole, cdiv(self.window - 1 + chunk, page_size) + 1)


@dataclasses.dataclass(frozen=True)
class KVLayout:
    groups: tuple[KVGroup, ...]
    num_layers: int

    @property
    def num_slots(self) -> int:
        """Arrays in the pool (layers per group)."""
        return max(len(g.layers) for g in self.groups)

    @property
    def grouped(self) -> bool:
        """True when sequences need the group allocator (several groups, or a window)."""
        return len(self.groups) > 1 or self.groups[0].window is not None

    @property
    def multi(self) -> bool:
        """True when the model's step needs one page table per group."""
        return len(self.groups) > 1

    def layer_map(self) -> tuple[tuple[int, int], ...]:
        """(group, array) of each layer."""
        out: dict[int, tuple[int, int]] = {}
        for g, group in enumerate(self.groups):
            for k, layer in enumerate(group.layers):
                out[layer] = (g, k)
        return tuple(out[i] for i in range(self.num_layers))

    def pages_per_seq(self, num_tokens: int, page_size: int, chunk: int) -> int:
        """Pages (of all groups) one sequence of ``num_tokens`` holds at most."""
        return sum(g.max_pages(num_tokens, page_size, chunk) for g in self.groups)

    def max_tokens_for(self, pages: int, page_size: int, chunk: int, limit: int) -> int:
        """The longest sequence (<= limit) whose pages fit ``pages``; 0 if none does."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.pages_per_seq(mid, page_size, chunk) <= pages:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def describe(self) -> str:
        parts = [f"{'full' if g.window is None else f'window {g.window}'} x{len(g.layers)}"
                 for g in self.groups]
        return f"{len(self.groups)} KV group(s) of <= {self.num_slots} layers: " + ", ".join(parts)


def uniform_layout(num_layers: int) -> KVLayout:
    """Every layer in one full-attention group, each in its own array."""
    return KVLayout((KVGroup(None, tuple(range(num_layers))),), num_layers)


def plan_layout(windows: Sequence[int | None], hybrid: bool = True) -> KVLayout:
    """The KV groups of layers whose windows are ``windows`` (None: full attention)."""
    n = len(windows)
    if n == 0:
        raise ValueError("plan_layout: the model has no layers")
    for w in windows:
        if w is not None and int(w) < 1:
            raise ValueError(f"plan_layout: a sliding window must be >= 1, got {w}")
    if not hybrid:
        return uniform_layout(n)
    kinds = sorted(set(windows), key=lambda w: (w is not None, w or 0))
    if len(kinds) == 1:
        return KVLayout((KVGroup(kinds[0], tuple(range(n))),), n)
    by_kind = {k: [i for i, w in enumerate(windows) if w == k] for k in kinds}
    size = min(len(v) for v in by_kind.values())
    groups = [KVGroup(k, tuple(layers[i:i + size]))
              for k in kinds for layers in [by_kind[k]] for i in range(0, len(layers), size)]
    return KVLayout(tuple(groups), n)
