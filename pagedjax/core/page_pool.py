"""KV page pool bookkeeping: free list, ref counts, prefix cache, fork / CoW.

Host-side only (no JAX); the device holds the K/V bytes, this holds who owns
which page.  Every usable page is in exactly one of three states:

    free    ref 0, no cached content          (the free list, FIFO)
    used    ref >= 1, held by >= 1 page table
    cached  ref 0, holds a registered full page; evictable, LRU order

so `free + used + cached == total` (total = num_pages - 1: page 0 is the null
page, never handed out; padding slots write there).

API and choices
  allocate(n) -> list[int] | None   None (nothing taken) when fewer than n pages
                                    are free + cached. Takes free pages first,
                                    then evicts the least recently freed
                                    cached pages.
  free(pages)                       decrement; ValueError on a double free (or
                                    the null page / an out-of-range id), checked
                                    before anything changes. Pages are released
                                    in REVERSE order, so a sequence's tail pages
                                    are evicted before its head (a later block is
                                    useless without its parents).
  fork(pages) -> list[int]          share: ref + 1 each (pages must be held).
  acquire(pages)                    take a ref on held or cached pages.
  make_writable(page_ids, i) -> (page, src | None)
                                    copy-on-write before writing into
                                    page_ids[i]: if it is shared, allocate a
                                    fresh page, drop one ref on the old one,
                                    replace page_ids[i] IN PLACE and return
                                    (new, old): the device must copy old -> new
                                    before the step. Raises OutOfPages when no
                                    page is available. A registered page about
                                    to be written by its only owner leaves the
                                    cache (its content will change).
  lookup(token_ids, extra_key) -> list[int]
                                    pages of the longest run of cached full-page
                                    prefix hits, refs taken. Never covers the
                                    last token (at least one token must be
                                    computed to get logits). [] when caching is
                                    off. peek_prefix() is the same without
                                    side effects.
  register(page_ids, token_ids, num_computed_tokens, extra_key) -> int
                                    offer newly FULL, computed pages to the
                                    cache; returns the number of full pages. A
                                    page whose content is already cached under
                                    another page stays unregistered.
  evict(n=None) / reset_prefix_cache()  drop cached pages to the free list.
  stats() -> PoolStats; ref_count(p); num_allocatable; check_invariants().

Block hash: hash((parent_hash, tuple(page tokens), extra_key)), parent of the
first page is None. `extra_key` separates caches (cache_salt, adapter id).
The stored key tuple is compared on lookup, so a hash collision on the last
level cannot hand out wrong content. Callers may pass `block_hashes`, a list
the pool extends in place, to avoid rehashing a request's tokens every step.

KV groups (core/kv_groups.py): a hybrid model keeps one page table per group of
layers, and a page holds the K/V of one group only. `group` (default 0) names
the group a page's content belongs to in register / peek_prefix / lookup /
cached_block, so the same tokens cached for two groups are two pages. A page
table of a sliding-window group holds NULL_PAGE where its pages were given
back; register skips those entries.

Prefix counters count TOKENS (as vLLM does): prefix_queries += tokens looked
up, prefix_hits += tokens found.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

NULL_PAGE = 0


class OutOfPages(RuntimeError):
    """No free or evictable page left (raised by make_writable only)."""


@dataclass(frozen=True)
class PoolStats:
    total: int          # usable pages (num_pages - 1)
    free: int           # ref 0, no content
    used: int           # ref >= 1
    cached: int         # ref 0, registered content, evictable
    shared: int         # pages with ref > 1
    total_refs: int     # sum of ref counts = pages as seen by all page tables
    prefix_hits: int    # tokens
    prefix_queries: int  # tokens

    @property
    def allocatable(self) -> int:
        return self.free + self.cached

    @property
    def usage(self) -> float:
        return self.used / self.total if self.total else 0.0

    @property
    def pages_saved_by_sharing(self) -> int:
        """Pages that page tables reference but that exist only once."""
        return self.total_refs - self.used

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


class PagePool:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = False):
        if num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (page 0 is the reserved null page), "
                             f"got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_pages
        self._free: deque[int] = deque(range(1, num_pages))
        self._cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._num_used = 0
        self._page_key: dict[int, tuple] = {}    # page -> (parent, tokens, extra)
        self._page_hash: dict[int, object] = {}     # page -> its cache key (see _ckey)
        self._hash_to_page: dict[object, int] = {}  # cache key -> page
        self.prefix_hits = 0
        self.prefix_queries = 0

    # ---- sizes -------------------------------------------------------------
    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    @property
    def num_allocatable(self) -> int:
        return len(self._free) + len(self._cached)

    def ref_count(self, page: int) -> int:
        return self._ref[page]

    @property
    def ref_counts(self) -> list[int]:
        """Every page's reference count, indexed by page id: the live list, for
        readers that check many pages (the scheduler, per row per step). Read it only;
        the counts change through allocate, free, fork and make_writable."""
        return self._ref

    def is_cached(self, page: int) -> bool:
        """True if the page holds registered prefix-cache content."""
        return page in self._page_hash

    # ---- allocation --------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > self.num_allocatable:
            return None
        pages = []
        for _ in range(n):
            if self._free:
                page = self._free.popleft()
            else:
                page, _ = self._cached.popitem(last=False)
                self._unregister(page)
            self._ref[page] = 1
            pages.append(page)
        self._num_used += n
        return pages

    def free(self, pages: Sequence[int]) -> None:
        for page, count in Counter(pages).items():
            self._check_id(page)
            if self._ref[page] < count:
                raise ValueError(f"double free of page {page} (ref count {self._ref[page]}, "
                                 f"freed {count} time(s))")
        for page in reversed(pages):
            self._ref[page] -= 1
            if self._ref[page] == 0:
                self._num_used -= 1
                if page in self._page_hash:
                    self._cached[page] = None
                else:
                    self._free.append(page)

    def fork(self, pages: Sequence[int]) -> list[int]:
        for page in pages:
            self._check_id(page)
            if self._ref[page] == 0:
                raise ValueError(f"cannot fork page {page}: nobody holds it")
        for page in pages:
            self._ref[page] += 1
        return list(pages)

    def acquire(self, pages: Sequence[int]) -> None:
        """Take a ref on each page; cached (ref 0) pages become used again."""
        for page in pages:
            self._check_id(page)
            if self._ref[page] == 0 and page not in self._cached:
                raise ValueError(f"cannot acquire free page {page}")
        for page in pages:
            if self._ref[page] == 0:
                del self._cached[page]
                self._num_used += 1
            self._ref[page] += 1

    def make_writable(self, page_ids: list[int], index: int) -> tuple[int, int | None]:
        page = page_ids[index]
        self._check_id(page)
        if self._ref[page] == 0:
            raise ValueError(f"page {page} at index {index} is not held by anybody")
        if self._ref[page] == 1:
            if page in self._page_hash:
                self._unregister(page)
            return page, None
        new = self.allocate(1)
        if new is None:
            raise OutOfPages("no free page for copy-on-write")
        self._ref[page] -= 1  # stays >= 1: another owner still holds it
        page_ids[index] = new[0]
        return new[0], page

    def _check_id(self, page: int) -> None:
        if page == NULL_PAGE:
            raise ValueError("page 0 is the reserved null page")
        if not 0 < page < self.num_pages:
            raise ValueError(f"page id {page} out of range [1, {self.num_pages})")

    # ---- prefix cache ------------------------------------------------------
    def _unregister(self, page: int) -> None:
        h = self._page_hash.pop(page)
        del self._page_key[page]
        if self._hash_to_page.get(h) == page:
            del self._hash_to_page[h]

    @staticmethod
    def _ckey(h: int, group: int):
        """The cache key of block hash h in KV group ``group`` (group 0: h itself)."""
        return h if group == 0 else (group, h)

    def block_hash(self, i: int, token_ids: Sequence[int], extra_key: Hashable,
                   hashes: list[int]) -> int:
        """The hash of full block i (``hashes`` is extended in place as far as i)."""
        for k in range(len(hashes), i + 1):
            self._block_key(k, token_ids, extra_key, hashes)
        return hashes[i]

    def cached_block(self, i: int, token_ids: Sequence[int], extra_key: Hashable = None, *,
                     block_hashes: list[int], group: int = 0) -> int | None:
        """The page caching full block i for ``group``, or None; no refs, no counters."""
        if not self.enable_prefix_caching:
            return None
        self.block_hash(i, token_ids, extra_key, block_hashes)
        key, h = self._block_key(i, token_ids, extra_key, block_hashes)
        page = self._hash_to_page.get(self._ckey(h, group))
        return page if page is not None and self._page_key[page] == key else None

    def _block_key(self, i: int, token_ids: Sequence[int], extra_key: Hashable,
                   hashes: list[int], token_offset: int = 0) -> tuple[tuple, int]:
        """Key and hash of block i (``token_ids`` start at position ``token_offset``);
        hashes[:i] must be known. Extends hashes."""
        ps = self.page_size
        parent = hashes[i - 1] if i else None
        a = i * ps - token_offset
        key = (parent, tuple(token_ids[a:a + ps]), extra_key)
        if i == len(hashes):
            hashes.append(hash(key))
        return key, hashes[i]

    def peek_prefix(self, token_ids: Sequence[int], extra_key: Hashable = None, *,
                    block_hashes: list[int] | None = None, group: int = 0) -> list[int]:
        """Cached pages for the longest full-page prefix; no refs, no counters."""
        if not self.enable_prefix_caching:
            return []
        hashes = block_hashes if block_hashes is not None else []
        pages = []
        for i in range((len(token_ids) - 1) // self.page_size):
            key, h = self._block_key(i, token_ids, extra_key, hashes)
            page = self._hash_to_page.get(self._ckey(h, group))
            if page is None or self._page_key[page] != key:
                break
            pages.append(page)
        return pages

    def lookup(self, token_ids: Sequence[int], extra_key: Hashable = None, *,
               block_hashes: list[int] | None = None, group: int = 0) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        pages = self.peek_prefix(token_ids, extra_key, block_hashes=block_hashes, group=group)
        self.acquire(pages)
        self.prefix_queries += len(token_ids)
        self.prefix_hits += len(pages) * self.page_size
        return pages

    def register(self, page_ids: Sequence[int], token_ids: Sequence[int],
                 num_computed_tokens: int, extra_key: Hashable = None, *,
                 block_hashes: list[int] | None = None, start_page: int = 0,
                 group: int = 0, token_offset: int = 0) -> int:
        """Register pages [start_page, full) whose tokens are all computed.

        `start_page` skips pages already offered (needs `block_hashes` to cover
        them, else hashing restarts at 0). `token_ids` may start at position
        `token_offset` (a multiple of the page size, at most `start_page` pages and
        `len(block_hashes)` pages in). Returns the number of full pages.
        """
        ps = self.page_size
        full = min(num_computed_tokens // ps, len(page_ids), (token_offset + len(token_ids)) // ps)
        if not self.enable_prefix_caching:
            return full
        hashes = block_hashes if block_hashes is not None else []
        start = min(start_page, len(hashes))
        if token_offset % ps or token_offset > start * ps:
            raise ValueError(f"token_offset {token_offset}: expected a multiple of the page "
                             f"size {ps} at most {start * ps}")
        for i in range(start, full):
            key, h = self._block_key(i, token_ids, extra_key, hashes, token_offset)
            page = page_ids[i]
            if page == NULL_PAGE:  # given back by a sliding-window group
                continue
            if self._ref[page] == 0:
                raise ValueError(f"cannot register page {page}: nobody holds it")
            ck = self._ckey(h, group)
            if page in self._page_hash or ck in self._hash_to_page:
                continue
            self._page_hash[page] = ck
            self._page_key[page] = key
            self._hash_to_page[ck] = page
        return full

    def evict(self, n: int | None = None) -> int:
        """Move up to n (default all) LRU cached pages to the free list."""
        count = 0
        while self._cached and (n is None or count < n):
            page, _ = self._cached.popitem(last=False)
            self._unregister(page)
            self._free.append(page)
            count += 1
        return count

    def reset_prefix_cache(self) -> int:
        """Forget every cached page not in use (registered used pages stay)."""
        return self.evict()

    # ---- introspection -----------------------------------------------------
    def stats(self) -> PoolStats:
        return PoolStats(
            total=self.num_usable_pages, free=len(self._free), used=self._num_used,
            cached=len(self._cached), shared=sum(1 for r in self._ref if r > 1),
            total_refs=sum(self._ref), prefix_hits=self.prefix_hits,
            prefix_queries=self.prefix_queries)

    def cached_pages_lru(self) -> list[int]:
        """Evictable pages, next to be evicted first."""
        return list(self._cached)

    def check_invariants(self, holders: Iterable[Sequence[int]] | None = None) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent.

        `holders`: every page table that holds refs; then ref counts must equal
        the number of times each page appears in them.
        """
        free, cached = set(self._free), set(self._cached)
        used = {p for p in range(1, self.num_pages) if self._ref[p] > 0}
        assert len(free) == len(self._free), "page twice in the free list"
        assert not (free & cached) and not (free & used) and not (cached & used)
        assert len(free) + len(used) + len(cached) == self.num_usable_pages
        assert len(used) == self._num_used
        assert self._ref[NULL_PAGE] == 0 and NULL_PAGE not in free | cached
        assert all(p in self._page_hash for p in cached)
        assert not any(p in self._page_hash for p in free)
        for h, p in self._hash_to_page.items():
            assert self._page_hash[p] == h
        if holders is not None:
            counts = Counter(p for table in holders for p in table)
            assert NULL_PAGE not in counts, "a page table holds the null page"
            for p in range(1, self.num_pages):
                assert counts.get(p, 0) == self._ref[p], (
                    f"page {p}: ref {self._ref[p]} but held {counts.get(p, 0)} times")
