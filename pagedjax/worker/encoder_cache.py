"""The encoder cache: each image's vision-encoder output, on the device, by content hash.

    cache = EncoderCache(encode, capacity_tokens=8192)
    rows = cache.get(item, holder="req-1")      # encodes on a miss (its own program)
    cache.release("req-1")                      # every image of req-1 consumed

The encoder runs once per image (``encode(item.data) -> [R, H]``, R >= the image's
placeholder tokens: a jitted program per static patch bucket, padded rows last). An entry stays while
some request holds it (``get`` with its id) and has not released it (the engine
releases a request when all of its image tokens are computed, or when it leaves);
entries nobody holds stay as a least-recently-used reserve of up to
``capacity_tokens`` rows, so the same image in a later request hits the cache.
"""

from __future__ import annotations

import collections
import time
from typing import Callable

from pagedjax.core.mm_item import MMItem


class EncoderCache:
    def __init__(self, encode: Callable, capacity_tokens: int = 8192):
        self.encode = encode
        self.capacity_tokens = int(capacity_tokens)
        self.entries: dict[str, object] = {}  # hash -> device array [n, H]
        self.holders: dict[str, set[str]] = {}  # hash -> request ids holding it
        self.held: dict[str, set[str]] = {}  # request id -> hashes it holds
        self.free_lru: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0
        self.encode_seconds = 0.0  # host time dispatching the encoder (async on devices)

    def get(self, item: MMItem, holder: str):
        """The image's encoder output [R >= length, H] (a device array); ``holder`` keeps it."""
        h = item.content_hash
        rows = self.entries.get(h)
        if rows is None:
            self.misses += 1
            t0 = time.perf_counter()
            rows = self.encode(item.data)
            self.encode_seconds += time.perf_counter() - t0
            if rows.shape[0] < item.length:
                raise ValueError(f"the vision encoder made {rows.shape[0]} rows for an image "
                                 f"with {item.length} placeholder tokens")
            self.entries[h] = rows
        else:
            self.hits += 1
        self.free_lru.pop(h, None)
        self.holders.setdefault(h, set()).add(holder)
        self.held.setdefault(holder, set()).add(h)
        return rows

    def release(self, holder: str) -> None:
        """``holder`` needs none of its images any more."""
        for h in self.held.pop(holder, ()):
            users = self.holders.get(h)
            if users is None:
                continue
            users.discard(holder)
            if not users:
                del self.holders[h]
                self.free_lru[h] = int(self.entries[h].shape[0])
        self._trim()

    def holder_ids(self) -> list[str]:
        return list(self.held)

    def _trim(self) -> None:
        total = sum(self.free_lru.values())
        while self.free_lru and total > self.capacity_tokens:
            h, n = self.free_lru.popitem(last=False)
            self.entries.pop(h, None)
            total -= n

    @property
    def num_entries(self) -> int:
        return len(self.entries)

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self.entries),
                "held": len(self.holders), "encode_seconds": self.encode_seconds}
