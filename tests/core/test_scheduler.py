"""Scheduler tests. The "model" is a fake KV memory: every scheduled token is
written into its page slot (after the step's copy-on-write copies), and every
row checks that its page table reads back exactly the sequence's tokens."""

import random
from types import SimpleNamespace

import pytest

from pagedjax.core.request import Request, RequestStatus
from pagedjax.core.scheduler import Scheduler, SchedulerOutput


def sp(max_tokens=8, **kw):
    return SimpleNamespace(max_tokens=max_tokens, **kw)


def req(rid, prompt, max_tokens=8, eos=(), priority=0, arrival=None, **kw):
    return Request(rid, list(prompt), sp(max_tokens, **kw), eos_token_ids=eos,
                   priority=priority, arrival_time=arrival)


class Harness:
    def __init__(self, sched: Scheduler, sampler=None):
        self.s = sched
        self.mem: dict[int, list] = {}
        self.sampler = sampler or (lambda rid, pos, i: 1000 + (hash((rid, pos, i)) % 50))
        self.outputs: list[SchedulerOutput] = []
        self.finished: dict[str, Request] = {}
        self.lists: dict[str, list[int]] = {}  # id -> its page list, from the rows' changes

    def check_list_contract(self, out: SchedulerOutput) -> None:
        """Each row's page change (page_start, new_page_ids: scheduler_output.py),
        applied to the list the earlier rows built, gives the row's page list."""
        for row in out.rows:
            known = self.lists.get(row.request_id, [])
            assert row.page_start <= len(known), "page_start past the pages sent so far"
            known = self.lists[row.request_id] = known[:row.page_start] + list(row.new_page_ids)
            assert known == row.page_ids, "page change does not give the row's pages"

    def run_model(self, out: SchedulerOutput) -> dict[str, list[int]]:
        s, ps = self.s, self.s.page_size
        assert out.num_batched_tokens == sum(len(r.token_ids) for r in out.rows)
        assert out.num_batched_tokens <= s.max_num_batched_tokens
        assert len(out.rows) <= s.max_num_seqs
        dsts = [d for _, d in out.page_copies]
        assert len(set(dsts)) == len(dsts)
        for i, (src, _) in enumerate(out.page_copies):  # in order == all at once
            assert src not in dsts[:i]
        self.check_list_contract(out)
        snapshot = {src: list(self.mem.get(src, [None] * ps)) for src, _ in out.page_copies}
        for src, dst in out.page_copies:
            self.mem[dst] = list(snapshot[src])
        written = set()
        for row in out.rows:
            r = s.get_request(row.request_id)
            assert r.status == RequestStatus.RUNNING and r.page_ids == row.page_ids
            end = row.start_pos + len(row.token_ids)
            assert len(row.page_ids) == -(-end // ps), "page table must cover exactly the row"
            assert row.token_ids == r.all_token_ids[row.start_pos:end]
            assert 0 not in row.page_ids
            for k, tok in enumerate(row.token_ids):
                page, off = divmod(row.start_pos + k, ps)
                key = (row.page_ids[page], off)
                assert key not in written, "two rows write the same slot"
                written.add(key)
                self.mem.setdefault(row.page_ids[page], [None] * ps)[off] = tok
        for row in out.rows:  # attention reads the whole context through the page table
            end = row.start_pos + len(row.token_ids)
            ctx = [self.mem[row.page_ids[q // ps]][q % ps] for q in range(end)]
            assert ctx == s.get_request(row.request_id).all_token_ids[:end]
        return {row.request_id: [self.sampler(row.request_id, row.start_pos + len(row.token_ids), i)
                                 for i in range(row.num_samples)]
                for row in out.rows if row.num_samples}

    def check(self):
        s = self.s
        s.pool.check_invariants([r.page_ids for r in s.running])
        for r in s.waiting:
            assert r.page_ids == [] and r.num_computed_tokens == 0
        st = s.stats()
        assert st.free + st.used + st.cached == st.total

    def step(self, sampled_override=None):
        out = self.s.schedule()
        self.outputs.append(out)
        sampled = self.run_model(out)
        if sampled_override:
            sampled.update(sampled_override)
        changed = self.s.update(out, sampled)
        for r in changed:
            if r.is_finished:
                self.finished[r.request_id] = r
        self.check()
        return out, changed

    def run(self, max_steps=500):
        for _ in range(max_steps):
            if not self.s.has_unfinished_requests():
                return self.finished
            self.step()
        raise AssertionError("did not finish")


def sched(**kw):
    args = dict(num_pages=64, page_size=4, max_num_seqs=8, max_num_batched_tokens=32,
                max_model_len=128)
    args.update(kw)
    return Scheduler(**args)


def test_token_budget_and_all_finish():
    h = Harness(sched(max_num_batched_tokens=16, max_num_seqs=3))
    rng = random.Random(0)
    for i in range(10):
        h.s.add_request(req(f"r{i}", [rng.randrange(100) for _ in range(rng.randint(1, 30))],
                            max_tokens=rng.randint(1, 6)))
    done = h.run()
    assert len(done) == 10
    assert all(r.finish_reason == "length" for r in done.values())
    assert all(r.num_output_tokens == r.max_tokens for r in done.values())
    assert max(o.num_batched_tokens for o in h.outputs) == 16
    assert h.s.stats().used == 0 and not h.s.requests


def test_chunked_prefill_splits_long_prompt():
    h = Harness(sched(max_num_batched_tokens=16))
    h.s.add_request(req("a", range(40), max_tokens=2))
    shapes = []
    for _ in range(3):
        out, _ = h.step()
        shapes.append([(r.start_pos, len(r.token_ids), r.num_samples) for r in out.rows])
    assert shapes == [[(0, 16, 0)], [(16, 16, 0)], [(32, 8, 1)]]
    assert h.s.get_request("a").num_output_tokens == 1


def test_no_chunked_prefill_admits_whole_prompts_only():
    with pytest.raises(ValueError, match="chunked prefill"):
        sched(enable_chunked_prefill=False, max_num_batched_tokens=16)
    h = Harness(sched(enable_chunked_prefill=False, max_num_batched_tokens=128))
    h.s.add_request(req("a", range(100), max_tokens=3))
    h.s.add_request(req("b", range(40), max_tokens=3))
    out, _ = h.step()
    assert [(r.request_id, len(r.token_ids)) for r in out.rows] == [("a", 100)]
    out, _ = h.step()
    assert [(r.request_id, len(r.token_ids)) for r in out.rows] == [("a", 1), ("b", 40)]
    h.run()


def test_running_before_waiting():
    h = Harness(sched(max_num_batched_tokens=10))
    h.s.add_request(req("a", range(5)))
    h.step()
    h.s.add_request(req("b", range(30)))
    out, _ = h.step()
    assert [(r.request_id, len(r.token_ids)) for r in out.rows] == [("a", 1), ("b", 9)]
    assert out.rows[1].num_samples == 0


def test_max_num_seqs_limits_admission():
    h = Harness(sched(max_num_seqs=2))
    for i in range(4):
        h.s.add_request(req(f"r{i}", range(3)))
    out, _ = h.step()
    assert [r.request_id for r in out.rows] == ["r0", "r1"]
    assert h.s.num_running == 2 and h.s.num_waiting == 2


def test_preemption_with_small_pool_recomputes_and_finishes():
    # 8 usable pages of 4 tokens; three requests growing to 6 + 20 tokens each
    h = Harness(sched(num_pages=9, max_num_batched_tokens=64))
    for i in range(3):
        h.s.add_request(req(f"r{i}", [i] * 6, max_tokens=20))
    preempted = []
    for _ in range(300):
        if not h.s.has_unfinished_requests():
            break
        out, _ = h.step()
        for rid in out.preempted_ids:
            r = h.s.get_request(rid)
            assert r.status == RequestStatus.PREEMPTED and r.page_ids == []
            preempted.append(rid)
        k = len(out.preempted_ids)
        assert [r.request_id for r in h.s.waiting][:k] == out.preempted_ids[::-1]
    assert preempted and preempted[0] == "r2"  # the newest goes first
    done = h.finished
    assert sorted(done) == ["r0", "r1", "r2"]
    assert all(r.num_output_tokens == 20 for r in done.values())
    assert done["r2"].num_preemptions >= 1
    # recompute fed prompt + earlier outputs again (checked by the KV model) in one row
    assert any(len(r.token_ids) > 6 and r.start_pos == 0 for o in h.outputs for r in o.rows)


def test_preempted_request_goes_to_front_of_waiting():
    h = Harness(sched(num_pages=5, max_num_batched_tokens=64))  # 4 pages
    h.s.add_request(req("a", range(8), max_tokens=20))
    h.s.add_request(req("b", range(8), max_tokens=20))
    h.step()  # both admitted: 2 + 2 pages
    h.s.add_request(req("c", range(3)))
    out, _ = h.step()  # a needs a third page: b is preempted
    assert out.preempted_ids == ["b"]
    assert [r.request_id for r in h.s.waiting] == ["b", "c"]
    assert [r.request_id for r in out.rows] == ["a"]  # no admissions in a preempting step


def test_lone_request_outgrowing_pool_finishes_with_length():
    h = Harness(sched(num_pages=3, max_model_len=1000))  # 2 pages = 8 tokens
    h.s.add_request(req("a", range(5), max_tokens=100))
    done = h.run()
    assert done["a"].finish_reason == "length" and done["a"].num_tokens == 8


def test_abort_at_any_time_frees_pages():
    h = Harness(sched(max_num_batched_tokens=8))
    h.s.add_request(req("w", range(3)))
    assert h.s.abort_request("w").status == RequestStatus.FINISHED_ABORTED
    assert h.s.abort_request("w") is None and h.s.abort_request("nope") is None
    h.s.add_request(req("a", range(20)))
    h.s.add_request(req("b", range(3)))
    h.step()  # a mid-prefill, b waiting
    a = h.s.abort_request("a")
    assert a.finish_reason == "abort" and a.page_ids == []
    out = h.s.schedule()
    assert [r.request_id for r in out.rows] == ["b"]
    h.s.abort_request("b")  # between schedule and update
    assert h.s.update(out, {"b": [5]}) == []
    assert h.s.stats().used == 0 and not h.s.has_unfinished_requests()
    h.check()


def test_parallel_sampling_forks_and_copy_on_write():
    h = Harness(sched(page_size=4))
    h.s.add_request(req("p", range(6), max_tokens=4, n=3))
    out, changed = h.step()
    assert out.rows[0].num_samples == 3
    ids = sorted(r.request_id for r in changed)
    assert ids == ["p", "p-1", "p-2"]
    kids = [h.s.get_request(i) for i in ids]
    assert [k.sample_index for k in kids] == [0, 1, 2]
    assert [k.parent_id for k in kids] == [None, "p", "p"]
    assert kids[0].page_ids == kids[1].page_ids == kids[2].page_ids
    st = h.s.stats()
    assert st.used == 2 and st.shared == 2 and st.pages_saved_by_sharing == 4
    out, _ = h.step()
    # the half-filled page 1 is shared: two writers copy, the last writes in place
    assert len(out.page_copies) == 2
    assert len({tuple(r.page_ids) for r in out.rows}) == 3
    assert all(r.page_ids[0] == kids[0].page_ids[0] for r in out.rows)  # full page still shared
    done = h.run()
    assert len(done) == 3 and all(r.num_output_tokens == 4 for r in done.values())
    assert len({tuple(r.output_token_ids) for r in done.values()}) == 3


def test_n_counts_against_max_num_seqs():
    s = sched(max_num_seqs=4)
    with pytest.raises(ValueError, match="max_num_seqs"):
        s.add_request(req("x", range(3), n=5))
    h = Harness(s)
    h.s.add_request(req("a", range(3)))
    h.s.add_request(req("b", range(3), n=4))
    out, _ = h.step()
    assert [r.request_id for r in out.rows] == ["a"]  # 1 + 4 > 4
    h.run()


def test_prefix_cache_hits_for_shared_prefix():
    h = Harness(sched(enable_prefix_caching=True))
    system = list(range(100, 110))  # 2 full pages + 2 tokens
    h.s.add_request(req("a", system + [1, 2, 3], max_tokens=3))
    h.step()
    h.s.add_request(req("b", system + [7, 8], max_tokens=2))
    out, _ = h.step()
    row_b = next(r for r in out.rows if r.request_id == "b")
    assert row_b.start_pos == 8 and row_b.token_ids == [108, 109, 7, 8]
    b, a = h.s.get_request("b"), h.s.get_request("a")
    assert b.num_cached_tokens == 8 and b.page_ids[:2] == a.page_ids[:2]
    st = h.s.stats()
    assert st.prefix_hits == 8 and st.prefix_queries == 13 + 12
    h.run()
    # finished pages stay cached; an identical prompt hits everything but the last token
    h.s.add_request(req("c", system + [1, 2, 3], max_tokens=1))
    out, _ = h.step()
    assert out.rows[0].start_pos == 12 and out.rows[0].token_ids == [3]


def test_cache_salt_separates_prefix_cache():
    h = Harness(sched(enable_prefix_caching=True))
    h.s.add_request(Request("a", list(range(9)), sp(2)))
    h.run()
    h.s.add_request(Request("b", list(range(9)), sp(2), cache_salt="tenant"))
    out, _ = h.step()
    assert out.rows[0].start_pos == 0


STOP_CASES = [
    # (params, eos, forced tokens, expected outputs, finish_reason, stop_reason)
    (dict(max_tokens=10), (2,), [5, 2, 9], [5, 2], "stop", None),
    (dict(max_tokens=4, ignore_eos=True), (2,), [2, 2, 2, 2], [2, 2, 2, 2], "length", None),
    (dict(max_tokens=10, min_tokens=2), (2,), [2, 2, 2], [2, 2, 2], "stop", None),
    (dict(max_tokens=10, stop_token_ids=[7]), (), [1, 7], [1, 7], "stop", 7),
    (dict(max_tokens=10, stop_token_ids=[7], ignore_eos=True), (7,), [7], [7], "stop", 7),
    (dict(max_tokens=3), (), [1, 1, 1, 1], [1, 1, 1], "length", None),
    (dict(max_tokens=None), (), [1] * 20, [1] * 6, "length", None),  # max_model_len 10
]


@pytest.mark.parametrize("params,eos,tokens,expected,reason,stop_reason", STOP_CASES)
def test_stop_conditions(params, eos, tokens, expected, reason, stop_reason):
    s = sched(max_model_len=10)
    s.add_request(Request("a", [3, 3, 3, 3], SimpleNamespace(**params), eos_token_ids=eos))
    it = iter(tokens)
    h = Harness(s, sampler=lambda rid, pos, i: next(it))
    done = h.run()
    assert done["a"].output_token_ids == expected
    assert done["a"].finish_reason == reason and done["a"].stop_reason == stop_reason
    assert s.stats().used == 0


def test_finish_request_and_fork_request():
    h = Harness(sched())
    h.s.add_request(req("a", range(6), max_tokens=50))
    h.step()
    child = h.s.fork_request("a", "a-beam")
    a = h.s.get_request("a")
    assert child.page_ids == a.page_ids and child.parent_id == "a"
    assert child.output_token_ids == a.output_token_ids
    child.output_token_ids[-1] = 77  # the engine may replace the pending token
    h.step()
    with pytest.raises(ValueError):
        h.s.fork_request("a", "a-beam")
    with pytest.raises(ValueError):
        h.s.fork_request("zz", "new")
    r = h.s.finish_request("a", "stop", stop_reason="</s>")
    assert r.status == RequestStatus.FINISHED_STOPPED and r.stop_reason == "</s>"
    assert h.s.finish_request("a", "stop") is None
    with pytest.raises(ValueError):
        h.s.finish_request("a-beam", "done")
    h.s.abort_request("a-beam")
    assert h.s.stats().used == 0


def test_priority_policy_orders_waiting_and_picks_victim():
    h = Harness(sched(policy="priority", max_num_seqs=1))
    h.s.add_request(req("low", range(3), priority=5, arrival=1.0, max_tokens=1))
    h.s.add_request(req("high", range(3), priority=0, arrival=2.0, max_tokens=1))
    h.s.add_request(req("high2", range(3), priority=0, arrival=3.0, max_tokens=1))
    order = [h.step()[0].rows[0].request_id for _ in range(3)]
    assert order == ["high", "high2", "low"]

    h = Harness(sched(policy="priority", num_pages=5, max_num_batched_tokens=64))
    h.s.add_request(req("vip", range(8), priority=0, arrival=2.0, max_tokens=20))
    h.s.add_request(req("bulk", range(8), priority=9, arrival=1.0, max_tokens=20))
    h.step()
    assert [r.request_id for r in h.s.running] == ["vip", "bulk"]
    out, _ = h.step()
    assert out.preempted_ids == ["bulk"]
    done = h.run()
    assert set(done) == {"vip", "bulk"}


def test_priority_preempts_an_already_scheduled_row():
    h = Harness(sched(policy="priority", num_pages=5, max_num_batched_tokens=64))
    h.s.add_request(req("bulk", range(6), priority=9, arrival=1.0, max_tokens=20))
    h.step()
    h.s.add_request(req("vip", range(8), priority=0, arrival=2.0, max_tokens=20))
    h.step()
    assert [r.request_id for r in h.s.running] == ["bulk", "vip"]
    out, _ = h.step()  # bulk is scheduled first, then vip needs a page: bulk goes
    assert out.preempted_ids == ["bulk"] and [r.request_id for r in out.rows] == ["vip"]
    assert h.s.stats().used == len(h.s.get_request("vip").page_ids)
    h.run()


def test_clear_value_errors():
    s = sched(num_pages=5, max_model_len=64)  # 4 pages of 4 tokens
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(req("a", range(65)))
    with pytest.raises(ValueError, match="raise num_pages"):
        s.add_request(req("a", range(17)))
    with pytest.raises(ValueError, match="empty"):
        s.add_request(req("a", []))
    with pytest.raises(ValueError, match="max_tokens"):
        s.add_request(req("a", [1], max_tokens=-1))
    s.add_request(req("a", range(16)))
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(req("a", [1]))
    with pytest.raises(ValueError, match="policy"):
        sched(policy="lifo")
    with pytest.raises(ValueError, match="max_num_seqs"):
        sched(max_num_seqs=0)
    with pytest.raises(ValueError, match="null page"):
        sched(num_pages=1)


def test_kv_waste_and_counts():
    h = Harness(sched(page_size=4))
    assert h.s.kv_waste() == 0.0
    h.s.add_request(req("a", range(5)))
    h.s.add_request(req("b", range(8)))
    assert h.s.num_waiting == 2 and h.s.get_num_unfinished_requests() == 2
    h.step()
    # a: 5 computed in 2 pages, b: 8 computed in 2 pages -> 13 of 16 slots
    assert h.s.kv_waste() == pytest.approx(3 / 16)
    assert h.s.num_running == 2


@pytest.mark.parametrize("seed", range(40))
def test_random_workload_invariants(seed):
    """Arrivals, n > 1, engine forks, aborts, stops, preemption, prefix hits, CoW:
    the KV model and the pool invariants are checked after every step."""
    rng = random.Random(seed)
    s = sched(num_pages=rng.randint(6, 20), page_size=rng.choice([1, 2, 4]),
              max_num_seqs=rng.randint(1, 6), max_num_batched_tokens=rng.randint(4, 24),
              max_model_len=rng.choice([24, 48]), enable_prefix_caching=rng.random() < 0.7,
              policy=rng.choice(["fcfs", "priority"]))
    h = Harness(s)
    prefix = [rng.randrange(3) for _ in range(8)]
    added = 0
    for step in range(600):
        if rng.random() < 0.3 and added < 15:
            prompt = prefix[:rng.randint(0, 8)] + [rng.randrange(3) for _ in range(rng.randint(1, 10))]
            if -(-len(prompt) // s.page_size) <= s.pool.num_usable_pages:
                s.add_request(req(f"r{added}", prompt, max_tokens=rng.randint(1, 12),
                                  n=rng.randint(1, min(3, s.max_num_seqs)), eos=(0,),
                                  priority=rng.randrange(3), min_tokens=rng.randint(0, 2),
                                  stop_token_ids=[1] if rng.random() < 0.2 else None))
                added += 1
        if not s.has_unfinished_requests():
            if added >= 15:
                break
            continue
        if rng.random() < 0.1 and s.running:  # beam-search style fork by the engine
            r = rng.choice(s.running)
            if r.output_token_ids and r.num_computed_tokens == r.num_tokens - 1:
                s.fork_request(r.request_id, f"{r.request_id}b{step}")
        h.step()
        if rng.random() < 0.03 and s.requests:
            s.abort_request(rng.choice(sorted(s.requests)))
    assert added == 15 and not s.has_unfinished_requests()
    st = s.stats()
    assert st.used == 0 and st.free + st.cached == st.total


# --------------------------------------------------------------------------- overlapped steps
class PipelinedHarness(Harness):
    """Schedules step N+1 before updating step N, as the overlapped engine does: a
    row may feed a placeholder (-1) which the "device" resolves from step N's
    sampled tokens. Memory writes happen in step order, like the device's."""

    def run_model(self, out, prev_sampled):
        s, ps = self.s, self.s.page_size
        assert len(out.rows) <= s.max_num_seqs
        assert out.num_batched_tokens <= s.max_num_batched_tokens
        self.check_list_contract(out)
        snapshot = {src: list(self.mem.get(src, [None] * ps)) for src, _ in out.page_copies}
        for src, dst in out.page_copies:
            self.mem[dst] = list(snapshot[src])
        resolved = {}
        for row in out.rows:
            toks = list(row.token_ids)
            if toks[-1] == -1:
                toks[-1] = prev_sampled[row.request_id][0]
                self.placeholders += 1
            assert -1 not in toks
            resolved[row.request_id] = toks
            for k, tok in enumerate(toks):
                page, off = divmod(row.start_pos + k, ps)
                self.mem.setdefault(row.page_ids[page], [None] * ps)[off] = tok
        for row in out.rows:
            r = s.get_request(row.request_id)
            end = row.start_pos + len(row.token_ids)
            ctx = [self.mem[row.page_ids[q // ps]][q % ps] for q in range(end)]
            known = min(end, r.num_tokens)
            assert ctx[:known] == r.all_token_ids[:known]
            assert ctx[known:] == resolved[row.request_id][len(row.token_ids) - (end - known):]
        return {row.request_id: [self.sampler(row.request_id, row.start_pos + len(row.token_ids), i)
                                 for i in range(row.num_samples)]
                for row in out.rows if row.num_samples}

    placeholders = 0

    def run(self, max_steps=800):
        prev = None
        for _ in range(max_steps):
            if not self.s.has_unfinished_requests() and prev is None:
                return self.finished
            out = self.s.schedule()
            sampled = self.run_model(out, prev[1] if prev else {}) if out.rows else None
            if prev is not None:
                for r in self.s.update(*prev):
                    if r.is_finished:
                        self.finished[r.request_id] = r
                self.check()
            prev = (out, sampled) if out.rows else None
        raise AssertionError("did not finish")


@pytest.mark.parametrize("seed", range(12))
def test_overlapped_scheduling_gives_serial_outputs(seed):
    """Random workloads (tight pools: preemption; small budgets: chunked prefill; n > 1;
    EOS; prefix caching): scheduling one step ahead with placeholders ends with the
    same output tokens and finish reasons as serial scheduling, and frees every page."""
    rng = random.Random(seed)
    kw = dict(num_pages=rng.choice([12, 20, 64]), page_size=4, max_num_seqs=rng.choice([3, 6]),
              max_num_batched_tokens=rng.choice([8, 16, 32]), max_model_len=64,
              enable_prefix_caching=rng.random() < 0.5)
    work = []
    for i in range(rng.randint(3, 9)):
        prompt = [rng.randint(1, 30) for _ in range(rng.randint(1, 20))]
        if i and rng.random() < 0.3:
            prompt = list(work[0][1][:8]) + prompt[:4]  # shared prefixes
        n = rng.choice([1, 1, 1, 2, 3])
        work.append((f"q{i}", prompt, rng.randint(1, 14), n))

    def sampler(rid, pos, i):
        return 1000 + (hash((rid, pos, i, seed)) % 40)  # 1000..1039; 1013 is EOS

    results = []
    for harness_cls in (Harness, PipelinedHarness):
        s = Scheduler(**kw)
        h = harness_cls(s, sampler)
        for rid, prompt, max_tokens, n in work:
            s.add_request(req(rid, prompt, max_tokens=max_tokens, eos=(1013,), n=n))
        done = h.run()
        results.append({rid: (r.output_token_ids, r.finish_reason) for rid, r in done.items()})
        preemptions = sum(r.num_preemptions for r in done.values())
        if harness_cls is PipelinedHarness:
            assert h.placeholders > 0
            print(f"placeholders {h.placeholders}, preemptions {preemptions}")
        st = s.stats()
        assert st.used == 0 and st.total_refs == 0, st
    assert results[1] == results[0]


@pytest.mark.parametrize("prompt_len, budget", [(16, 64), (17, 8)])
def test_prefill_only_request_samples_nothing(prompt_len, budget):
    """max_tokens=0 (pooling): its rows sample nothing (no placeholder), it gets no
    page past its prompt and finishes ('length') when its last prompt row lands,
    scheduled overlapped; (17, 8): chunks of 8, 8 and a last row of one token."""
    s = Scheduler(num_pages=16, page_size=8, max_num_seqs=4, max_num_batched_tokens=budget,
                  max_model_len=64)
    r = req("p", range(1, prompt_len + 1), max_tokens=0)
    g = req("g", range(100, 104), max_tokens=3)
    s.add_request(r)
    s.add_request(g)
    rows_of_p, finished, prev = [], {}, None
    for _ in range(10):
        out = s.schedule()  # the next step is scheduled before the last one's update
        rows_of_p += [row for row in out.rows if row.request_id == "p"]
        if prev is not None:
            sampled = {row.request_id: [7] for row in prev.rows if row.num_samples}
            finished.update({q.request_id: q for q in s.update(prev, sampled) if q.is_finished})
        prev = out
        if "p" in s.requests:
            assert len(r.page_ids) <= -(-prompt_len // 8) and r.num_pending == 0
    assert sum(len(row.token_ids) for row in rows_of_p) == prompt_len
    assert all(row.num_samples == 0 for row in rows_of_p)
    assert r.output_token_ids == [] and finished["p"].finish_reason == "length"
    assert finished["g"].output_token_ids == [7, 7, 7]
    assert s.pool.stats().used == 0 and not s.has_unfinished_requests()


def test_prefill_only_needs_one_sample():
    s = Scheduler(num_pages=8, page_size=8, max_num_seqs=4, max_num_batched_tokens=32,
                  max_model_len=64)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        s.add_request(req("x", [1, 2], max_tokens=0, n=2))
