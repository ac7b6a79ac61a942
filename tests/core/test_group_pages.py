"""Hybrid KV groups on the host: the layout, and the scheduler with one page table
per group. The "model" is a fake KV memory per page: every scheduled token is
written into each group's page slot, and every row checks that each group's table
reads back the tokens its layers see (the whole context for a full group, the
window for a sliding one)."""

import random
from types import SimpleNamespace

import pytest

from pagedjax.core.kv_groups import KVGroup, plan_layout, uniform_layout
from pagedjax.core.page_pool import NULL_PAGE
from pagedjax.core.request import Request
from pagedjax.core.scheduler import Scheduler
from pagedjax.utils import cdiv

PS, W = 4, 9


def gemma_windows(n, window=W, pattern=6):
    return [window if (i + 1) % pattern else None for i in range(n)]


def test_layout_gemma3_pattern():
    layout = plan_layout(gemma_windows(18, 512))
    assert layout.num_slots == 3 and len(layout.groups) == 6
    assert layout.groups[0] == KVGroup(None, (5, 11, 17))
    assert all(g.window == 512 and len(g.layers) == 3 for g in layout.groups[1:])
    lm = layout.layer_map()
    assert lm[5] == (0, 0) and lm[17] == (0, 2) and lm[0] == (1, 0) and lm[4] == (2, 1)
    # 26 layers: 4 full, 22 sliding -> groups of 4, the last sliding group shorter
    layout = plan_layout(gemma_windows(26, 512))
    assert layout.num_slots == 4 and [len(g.layers) for g in layout.groups] == [4] * 6 + [2]
    assert sorted(i for g in layout.groups for i in g.layers) == list(range(26))
    assert plan_layout(gemma_windows(18, 512), hybrid=False) == uniform_layout(18)
    assert not uniform_layout(4).grouped and plan_layout([7, 7]).grouped


def test_layout_pages_and_capacity():
    layout = plan_layout(gemma_windows(6, 512))  # 1 full + 5 sliding layers
    assert len(layout.groups) == 6 and layout.num_slots == 1
    # at 8k tokens with a 512 chunk: full 512 pages, each sliding group 64 + 1
    per = layout.pages_per_seq(8192, 16, 512)
    groups = len(layout.groups)
    assert per == 512 + (groups - 1) * (cdiv(511 + 512, 16) + 1)
    assert layout.max_tokens_for(per, 16, 512, 10**6) == 8192
    with pytest.raises(ValueError, match="sliding window"):
        plan_layout([0, None])


def req(rid, prompt, max_tokens=8, n=1):
    return Request(rid, list(prompt), SimpleNamespace(max_tokens=max_tokens, n=n))


class GroupHarness:
    def __init__(self, sched: Scheduler, seed=0):
        self.s = sched
        self.mem: dict[int, list] = {}
        self.rng = random.Random(seed)
        self.windows = sched.groups.windows
        self.max_sliding_held = 0
        self.lists: dict[str, list[list[int]]] = {}  # id -> each group's list, from the rows

    def tables(self, row):
        return [row.page_ids] + list(row.group_page_ids)

    def check_changes(self, out):
        """Each row's page change of every group (page_start / new_page_ids, then
        group_page_starts / group_new_page_ids: scheduler_output.py), applied to the
        lists the earlier rows built, gives the row's tables: what the worker's
        persistent batch holds."""
        for row in out.rows:
            known = self.lists.get(row.request_id) or [[] for _ in self.windows]
            starts = [row.page_start, *row.group_page_starts]
            news = [row.new_page_ids, *row.group_new_page_ids]
            for g, (start, new) in enumerate(zip(starts, news)):
                assert start <= len(known[g]), "page_start past the pages sent so far"
                known[g] = known[g][:start] + list(new)
            assert known == self.tables(row), "page changes do not give the row's tables"
            self.lists[row.request_id] = known

    def run_model(self, out):
        s = self.s
        self.check_changes(out)
        snapshot = {src: list(self.mem.get(src, [None] * PS)) for src, _ in out.page_copies}
        for src, dst in out.page_copies:
            self.mem[dst] = list(snapshot[src])
        for row in out.rows:
            for t in self.tables(row):
                for k, tok in enumerate(row.token_ids):
                    page, off = divmod(row.start_pos + k, PS)
                    assert t[page] != NULL_PAGE, "a written position sits on the null page"
                    self.mem.setdefault(t[page], [None] * PS)[off] = tok
        for row in out.rows:
            r = s.get_request(row.request_id)
            end = row.start_pos + len(row.token_ids)
            for w, t in zip(self.windows, self.tables(row)):
                assert len(t) == cdiv(end, PS)
                lo = 0 if w is None else max(0, row.start_pos - w + 1)
                ctx = [self.mem[t[q // PS]][q % PS] for q in range(lo, end)]
                seen = r.all_token_ids[:row.start_pos] + row.token_ids  # (proposals too)
                assert ctx == seen[lo:end], "a group reads wrong K/V"
        return {row.request_id: [self.rng.randrange(100, 150) for _ in range(row.num_samples)]
                for row in out.rows if row.num_samples}

    def check(self):
        s = self.s
        holders = [p for r in s.running for t in s.groups.tables(r) for p in t if p]
        s.pool.check_invariants([holders])
        for r in s.running:
            for g, w in enumerate(self.windows):
                if w is not None:
                    self.max_sliding_held = max(self.max_sliding_held, s.groups.held(r, g))

    def step(self):
        out = self.s.schedule()
        sampled = self.run_model(out)
        self.s.update(out, sampled)
        self.check()
        return out

    def run(self, limit=2000):
        for _ in range(limit):
            if not self.s.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("did not finish")


def sched(num_pages=200, caching=True, windows=(None, W, W, W), mnbt=16, **kw):
    return Scheduler(num_pages, PS, kw.pop("max_num_seqs", 8), mnbt, 256,
                     enable_prefix_caching=caching, kv_layout=plan_layout(list(windows)), **kw)


def test_long_decode_holds_the_window_only():
    s = sched()
    h = GroupHarness(s)
    s.add_request(req("a", range(1, 30), max_tokens=120))
    while s.has_unfinished_requests():
        h.step()
        r = s.get_request("a")
        if r is not None and r.num_computed_tokens > 60:
            for g in (1, 2):  # the last window's pages only, the rest given back
                assert s.groups.held(r, g) <= cdiv(W, PS) + 1
            assert len(r.page_ids) == cdiv(r.num_computed_tokens, PS)
    assert h.max_sliding_held <= cdiv(29 + 16, PS)  # a prompt chunk needs its pages
    assert s.stats().used == 0


def test_prefix_hit_serves_every_group():
    s = sched()
    h = GroupHarness(s)
    prompt = list(range(1, 42))
    s.add_request(req("a", prompt, max_tokens=3))
    h.run()
    s.add_request(req("b", prompt + [7, 8], max_tokens=3))
    out = h.step()
    b = s.get_request("b")
    assert b.num_cached_tokens == 40 and out.rows[0].start_pos == 40
    for g in (1, 2, 3):  # sliding: nothing before the window of position 40
        t = s.groups.tables(b)[g]
        assert t[:(40 - W + 1) // PS] == [0] * ((40 - W + 1) // PS)
    h.run()
    # a sliding-only hit must also find the window's pages: evict them -> shorter hit
    s.add_request(req("c", prompt + [9], max_tokens=2))
    s.pool.evict()
    h.step()
    assert s.get_request("c").num_cached_tokens == 0
    h.run()


def test_preemption_forks_and_random_load():
    rng = random.Random(3)
    s = sched(num_pages=40, caching=True, max_num_seqs=6)
    h = GroupHarness(s, seed=1)
    base = [rng.randrange(1, 90) for _ in range(20)]
    for i in range(12):
        prompt = (base[:rng.choice([0, 8, 12, 20])]
                  + [rng.randrange(1, 90) for _ in range(rng.randrange(1, 30))])
        s.add_request(req(f"r{i}", prompt, max_tokens=rng.randrange(1, 40),
                          n=rng.choice([1, 1, 2])))
    h.run()
    assert s.num_preemptions > 0
    assert s.stats().used == 0
    s.pool.check_invariants([])


def test_speculative_rollback_frees_every_group():
    s = sched(caching=False)
    h = GroupHarness(s)
    s.add_request(req("a", range(1, 20), max_tokens=50))
    h.step()
    h.step()
    a = s.get_request("a")
    a.spec_token_ids = [5, 6, 7, 8, 9]
    out = s.schedule()
    assert out.rows[0].num_spec == 5
    h.run_model(out)
    s.update(out, {"a": [5, 77]})  # one proposal accepted, then a correction
    assert a.num_computed_tokens == a.num_tokens - 1
    for t in s.groups.tables(a):
        assert len(t) == cdiv(a.num_computed_tokens, PS)
    h.check()
    h.run()
    assert s.stats().used == 0


def test_capacity_grows_with_hybrid_groups():
    layout = plan_layout(gemma_windows(6, 64))
    hybrid = Scheduler(401, 16, 8, 64, 2048, kv_layout=layout)
    uniform = Scheduler(401, 16, 8, 64, 2048, kv_layout=uniform_layout(6))
    # a page of the hybrid pool holds num_slots layers instead of 6; the same bytes
    # give 6 / num_slots more page ids
    ratio = 6 // layout.num_slots
    big = Scheduler(400 * ratio + 1, 16, 8, 64, 2048, kv_layout=layout)
    assert hybrid.kv_capacity()["pages_per_request"] < len(layout.groups) * 128
    assert big.kv_capacity()["max_concurrency"] > uniform.kv_capacity()["max_concurrency"]
    assert uniform.kv_capacity() == {"pages_per_request": 128, "max_concurrency": 400 / 128,
                                     "tokens": 6400}
    assert hybrid.max_seq_len == 2048 and hybrid.groups is not None
