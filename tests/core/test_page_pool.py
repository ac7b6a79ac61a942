"""PagePool: unit tests plus a stateful property test against a device model."""

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedjax.core.page_pool import NULL_PAGE, OutOfPages, PagePool


def test_null_page_never_handed_out():
    pool = PagePool(6, 4)
    pages = pool.allocate(5)
    assert sorted(pages) == [1, 2, 3, 4, 5] and NULL_PAGE not in pages
    assert pool.allocate(1) is None
    s = pool.stats()
    assert (s.total, s.free, s.used, s.cached) == (5, 0, 5, 0)
    with pytest.raises(ValueError, match="null page"):
        pool.free([0])
    pool.free(pages)
    assert NULL_PAGE not in pool.allocate(5)


def test_allocate_failure_takes_nothing():
    pool = PagePool(4, 4)
    assert pool.allocate(4) is None
    assert pool.stats().free == 3
    assert pool.allocate(0) == []
    with pytest.raises(ValueError):
        PagePool(1, 4)


def test_double_free_raises_and_changes_nothing():
    pool = PagePool(8, 4)
    a = pool.allocate(2)
    b = pool.allocate(1)
    pool.free(a)
    with pytest.raises(ValueError, match="double free"):
        pool.free(b + a)  # b is fine, a is not: nothing may change
    assert pool.ref_count(b[0]) == 1
    with pytest.raises(ValueError, match="double free"):
        pool.free(b + b)
    pool.check_invariants([b])


def test_fork_and_copy_on_write():
    pool = PagePool(8, 4)
    parent = pool.allocate(2)
    child = pool.fork(parent)
    assert child == parent and child is not parent
    assert [pool.ref_count(p) for p in parent] == [2, 2]
    assert pool.stats().pages_saved_by_sharing == 2
    new, src = pool.make_writable(child, 1)
    assert src == parent[1] and new not in parent and child[1] == new
    assert pool.ref_count(parent[1]) == 1 and pool.ref_count(new) == 1
    # the last owner writes in place
    assert pool.make_writable(parent, 1) == (parent[1], None)
    pool.check_invariants([parent, child])
    # out of pages during CoW
    rest = pool.allocate(pool.num_allocatable)
    with pytest.raises(OutOfPages):
        pool.make_writable(child, 0)
    pool.free(rest)
    with pytest.raises(ValueError):
        pool.fork(rest)


def test_prefix_cache_hits_and_last_token_rule():
    pool = PagePool(16, 4, enable_prefix_caching=True)
    tokens = list(range(12))  # exactly 3 pages
    pages = pool.allocate(3)
    assert pool.register(pages, tokens, 12) == 3
    # the last token must remain to compute: 12 tokens -> only 2 pages match
    assert pool.lookup(tokens) == pages[:2]
    assert pool.lookup(tokens + [99]) == pages
    assert pool.lookup(tokens[:4] + [7] * 8) == pages[:1]
    assert pool.lookup(tokens, extra_key="salt") == []
    assert pool.lookup([5] * 12) == []
    s = pool.stats()
    assert s.prefix_hits == 4 * (2 + 3 + 1) and s.prefix_queries == 12 + 13 + 12 + 12 + 12
    # hits took refs
    assert [pool.ref_count(p) for p in pages] == [4, 3, 2]
    pool.check_invariants([pages, pages[:2], pages, pages[:1]])


def test_partial_and_uncomputed_pages_not_registered():
    pool = PagePool(16, 4, enable_prefix_caching=True)
    tokens = list(range(10))
    pages = pool.allocate(3)
    assert pool.register(pages, tokens, 7) == 1  # only page 0 is full and computed
    assert pool.peek_prefix(tokens) == pages[:1]
    assert pool.register(pages, tokens, 10) == 2
    assert pool.peek_prefix(tokens) == pages[:2]
    # same content in another page: stays unregistered, the first one is kept
    other = pool.allocate(1)
    pool.register(other, tokens, 4)
    assert not pool.is_cached(other[0])


def test_cached_pages_revive_and_lru_eviction_order():
    pool = PagePool(7, 2, enable_prefix_caching=True)  # 6 usable pages
    a_tok, b_tok = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    a, b = pool.allocate(2), pool.allocate(2)
    pool.register(a, a_tok, 4)
    pool.register(b, b_tok, 4)
    pool.free(a)
    pool.free(b)
    s = pool.stats()
    assert (s.free, s.used, s.cached) == (2, 0, 4)
    # tail pages first within a sequence, older sequences first
    assert pool.cached_pages_lru() == [a[1], a[0], b[1], b[0]]
    # a hit revives a cached page and removes it from the LRU
    assert pool.lookup(b_tok) == b
    assert pool.cached_pages_lru() == [a[1], a[0]]
    pool.free(b)
    assert pool.cached_pages_lru() == [a[1], a[0], b[1], b[0]]
    # allocation uses free pages first, then evicts in LRU order
    got = pool.allocate(3)
    assert got[2] == a[1] and not pool.is_cached(a[1])
    assert pool.peek_prefix(a_tok) == [a[0]]
    pool.check_invariants([got])
    assert pool.evict(1) == 1 and pool.peek_prefix(a_tok) == []
    assert pool.reset_prefix_cache() == 2
    assert pool.stats().cached == 0


def test_writing_a_registered_page_drops_it_from_the_cache():
    pool = PagePool(4, 2, enable_prefix_caching=True)
    pages = pool.allocate(1)
    pool.register(pages, [1, 2, 3], 2)
    assert pool.make_writable(pages, 0) == (pages[0], None)
    assert not pool.is_cached(pages[0]) and pool.peek_prefix([1, 2, 3]) == []


def test_caching_disabled():
    pool = PagePool(8, 2)
    pages = pool.allocate(2)
    pool.register(pages, [1, 2, 3, 4], 4)
    pool.free(pages)
    assert pool.lookup([1, 2, 3, 4, 5]) == [] and pool.stats().cached == 0
    assert pool.stats().prefix_queries == 0


PS = 2


class PoolMachine(RuleBasedStateMachine):
    """Holders are page tables with a logical token list; `mem` models the device."""

    def __init__(self):
        super().__init__()
        self.pool = PagePool(9, PS, enable_prefix_caching=True)
        self.mem = {p: [None] * PS for p in range(9)}
        self.holders: list[dict] = []

    def _new_holder(self, pages, tokens, extra):
        self.holders.append({"pages": pages, "tokens": list(tokens), "extra": extra})

    @rule(n=st.integers(0, 4), extra=st.sampled_from([None, "x"]))
    def allocate(self, n, extra):
        pages = self.pool.allocate(n)
        if pages is None:
            assert n > self.pool.num_allocatable
            return
        assert NULL_PAGE not in pages
        for p in pages:
            assert self.pool.ref_count(p) == 1
        self._new_holder(pages, [], extra)  # fresh pages hold no tokens yet

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data, token):
        h = data.draw(st.sampled_from(self.holders))
        pages, tokens = h["pages"], h["tokens"]
        idx, off = divmod(len(tokens), PS)
        if idx >= len(pages):
            new = self.pool.allocate(1)
            if new is None:
                return
            pages.extend(new)
        else:
            try:
                dst, src = self.pool.make_writable(pages, idx)
            except OutOfPages:
                assert self.pool.num_allocatable == 0
                return
            if src is not None:
                self.mem[dst] = list(self.mem[src])
        page = pages[idx]
        # copy-on-write: the writer is the only owner of the page it writes
        assert self.pool.ref_count(page) == 1
        assert sum(hh["pages"].count(page) for hh in self.holders) == 1
        self.mem[page][off] = token
        tokens.append(token)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def fork(self, data):
        h = data.draw(st.sampled_from(self.holders))
        self._new_holder(self.pool.fork(h["pages"]), h["tokens"], h["extra"])

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def free(self, data):
        h = data.draw(st.sampled_from(self.holders))
        self.holders.remove(h)
        self.pool.free(h["pages"])

    @rule(page=st.integers(1, 8))
    def double_free(self, page):
        if self.pool.ref_count(page) == 0:
            before = self.pool.stats()
            with pytest.raises(ValueError):
                self.pool.free([page])
            assert self.pool.stats() == before

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def register(self, data):
        h = data.draw(st.sampled_from(self.holders))
        self.pool.register(h["pages"], h["tokens"], len(h["tokens"]), h["extra"])

    @rule(n=st.integers(0, 3))
    def evict(self, n):
        cached = self.pool.stats().cached
        assert self.pool.evict(n) == min(n, cached)

    @rule(tokens=st.lists(st.integers(0, 2), max_size=9), extra=st.sampled_from([None, "x"]))
    def lookup(self, tokens, extra):
        pages = self.pool.lookup(tokens, extra)
        assert len(pages) * PS <= max(len(tokens) - 1, 0)
        for i, p in enumerate(pages):
            assert self.mem[p] == tokens[i * PS:(i + 1) * PS], "cache returned wrong content"
        self._new_holder(pages, tokens[:len(pages) * PS], extra)

    @invariant()
    def bookkeeping(self):
        s = self.pool.stats()
        assert s.free + s.used + s.cached == s.total == 8
        self.pool.check_invariants([h["pages"] for h in self.holders])
        for h in self.holders:
            for p in h["pages"]:
                assert self.pool.ref_count(p) > 0
            toks = h["tokens"]
            for i, t in enumerate(toks):
                assert self.mem[h["pages"][i // PS]][i % PS] == t, "a holder's data was clobbered"
        for p in range(1, 9):  # every registered page still holds the content it is keyed by
            if self.pool.is_cached(p):
                assert list(self.pool._page_key[p][1]) == self.mem[p], f"stale cache entry {p}"


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
