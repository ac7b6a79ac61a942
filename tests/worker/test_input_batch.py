"""The persistent batch (pagedjax/worker/input_batch.py): rows added, removed and condensed;
page tables kept from the scheduler's explicit page changes (growth, copy-on-write,
speculative rollback, preemption, n > 1 forks); sampling columns that equal the row-by-row
build."""

import random

import numpy as np
import pytest

from pagedjax.core.request import Request
from pagedjax.core.scheduler import ScheduledRow, Scheduler
from pagedjax.engine.sequences import RequestSampling
from pagedjax.sample.metadata import RowState, build_sampling_tensors
from pagedjax.sampling_params import SamplingParams
from pagedjax.worker.input_batch import InputBatch
from pagedjax.worker.page_table import PageTable

V = 64


def sampling(*params, bad_words=()):
    return RequestSampling(list(params), 11, list(bad_words), None, False, False, set())


def add(batch, sid, params=None, prompt=(1, 2, 3), outputs=None, **kw):
    s = sampling(params or SamplingParams())
    return batch.add(sid, sid, 0, s, list(prompt), [] if outputs is None else outputs, **kw)


def test_rows_are_added_removed_and_condensed_with_their_columns():
    batch = InputBatch(page_width=8, capacity=2)  # grows past its first capacity
    temps = {f"s{i}": 0.1 * (i + 1) for i in range(5)}
    for i, (sid, t) in enumerate(temps.items()):
        add(batch, sid, SamplingParams(temperature=t, seed=i), lora_id=i)
        batch.page_table.set_row(batch.index[sid], [10 * i + 1, 10 * i + 2], sid)
    assert len(batch) == 5 and batch.page_table.capacity >= 5
    batch.remove("s1")  # the last row (s4) moves into row 1
    assert batch.index == {"s0": 0, "s4": 1, "s2": 2, "s3": 3} and len(batch) == 4
    assert batch.seq_ids == ["s0", "s4", "s2", "s3"]
    row = batch.index["s4"]
    assert batch.temperature[row] == np.float32(temps["s4"]) and batch.lora_id[row] == 4
    assert batch.page_table.table[row, :2].tolist() == [41, 42]
    assert batch.page_table.num_pages[row] == 2
    batch.remove("s3")  # the last row: nothing moves
    batch.remove("gone")  # unknown: nothing to do
    assert batch.index == {"s0": 0, "s4": 1, "s2": 2} and batch.request_of("s4") == ("s4", 0)
    with pytest.raises(ValueError, match="already has a row"):
        add(batch, "s0")
    assert add(batch, "s5") == 3  # a new row takes the next free index


def test_page_changes_keep_rows_equal_to_the_lists():
    """Growth, copy-on-write, rollback, preemption, new and departing sequences (past
    the first capacity): each row applies only its change, and the gathered table
    equals the page lists."""
    rng = random.Random(0)
    batch = InputBatch(page_width=16, capacity=2)
    live: dict[str, list[int]] = {}
    counter = 0
    for _ in range(300):
        if len(live) < 8 and rng.random() < 0.3:
            sid = f"s{counter}"
            counter += 1
            live[sid] = []
            add(batch, sid)
        rows = []
        for sid in list(live):
            pages, u = live[sid], rng.random()
            start = len(pages)
            if u < 0.15 and len(pages) < 16:
                pages.append(rng.randint(1, 99))  # a new page
            elif u < 0.2 and pages:
                j = rng.randrange(len(pages))  # copy-on-write of page j
                pages[j] = rng.randint(1, 99)
                start = j
            elif u < 0.25 and len(pages) > 1:
                start = rng.randint(1, len(pages) - 1)  # a rolled-back speculation
                del pages[start:]
            elif u < 0.28:
                live[sid] = pages = [rng.randint(1, 99)]  # preempted and readmitted
                start = 0
            elif u < 0.32:
                del live[sid]  # finished
                batch.remove(sid)
                continue
            rows.append(ScheduledRow(sid, [0], 0, pages, 1, 0, start, pages[start:]))
        rng.shuffle(rows)
        idx = batch.rows_of([r.request_id for r in rows])
        batch.apply_page_changes(rows, idx)
        p = rng.choice([8, 16])
        got = batch.page_table.gather(idx, p, 16)
        want = np.zeros((16, p), np.int32)
        for i, r in enumerate(rows):
            want[i, :min(p, len(r.page_ids))] = r.page_ids[:p]
        np.testing.assert_array_equal(got, want)


def test_page_table_refuses_a_missed_change_and_an_overflow():
    table = PageTable(width=4, capacity=2)
    table.apply(0, 0, [5, 6], "a")
    with pytest.raises(ValueError, match="missed"):
        table.apply(0, 3, [7], "a")
    with pytest.raises(ValueError, match="page-table width 4"):
        table.apply(0, 2, [7, 8, 9], "a")
    table.apply(0, 1, [], "a")  # rolled back to one page: the rest is zeroed
    assert table.table[0].tolist() == [5, 0, 0, 0] and table.num_pages[0] == 1


def _drive(sched, batch, rng, steps: int, check) -> list:
    """Run ``sched`` to the end, adding each new sequence to ``batch``, applying each
    step's page changes and calling ``check(rows, idx)``; returns the requests the
    updates yielded (forks and finished ones)."""
    seen = []
    for _ in range(steps):
        out = sched.schedule()
        if out.is_empty and not sched.has_unfinished_requests():
            break
        for r in out.rows:
            if r.request_id not in batch:
                req = sched.get_request(r.request_id)
                add(batch, r.request_id, prompt=req.prompt_token_ids,
                    outputs=req.output_token_ids)
        idx = batch.rows_of([r.request_id for r in out.rows])
        batch.apply_page_changes(out.rows, idx)
        check(out.rows, idx)
        sampled = {r.request_id: [rng.randint(0, 50) for _ in range(r.num_samples)]
                   for r in out.rows if r.num_samples}
        for req in sched.update(out, sampled):
            seen.append(req)
            if req.is_finished:
                batch.remove(req.request_id)
    assert not sched.has_unfinished_requests() and sched.num_preemptions > 0
    return seen


def test_scheduler_rows_drive_the_batch_through_preemption_prefix_caching_and_forks():
    """A real Scheduler over a small pool (preemption), with prefix caching (shared
    pages copied on write) and n > 1 forks: applying each step's explicit page
    changes keeps every running sequence's row equal to its page list."""
    rng = random.Random(1)
    sched = Scheduler(num_pages=14, page_size=4, max_num_seqs=6, max_num_batched_tokens=24,
                      max_model_len=64, enable_prefix_caching=True)
    batch = InputBatch(page_width=16, capacity=2)
    shared = list(range(100, 108))
    for i in range(8):
        n = 3 if i % 4 == 0 else 1
        params = SamplingParams(max_tokens=rng.randint(3, 12), n=n, ignore_eos=True)
        sched.add_request(Request(f"r{i}", shared + [i] * rng.randint(1, 6), params))
    def check(rows, idx):
        for i, r in enumerate(rows):
            n = int(batch.page_table.num_pages[idx[i]])
            assert batch.page_table.table[idx[i], :n].tolist() == r.page_ids

    seen = _drive(sched, batch, rng, 200, check)
    forks_seen = sum(req.parent_id is not None and req.sample_index > 0 for req in seen)
    assert forks_seen >= 4


def test_hybrid_kv_groups_keep_one_table_each_with_the_window_nulled():
    """Hybrid KV groups (one full, two sliding-window groups): each group's table
    row follows that group's explicit page changes; pages a sliding group gave
    back read as the null page 0, through preemption, prefix hits and forks."""
    from pagedjax.core.kv_groups import plan_layout

    rng = random.Random(2)
    sched = Scheduler(num_pages=40, page_size=4, max_num_seqs=6, max_num_batched_tokens=16,
                      max_model_len=64, enable_prefix_caching=True,
                      kv_layout=plan_layout([None, 8, 8]))
    groups = len(sched.groups.windows)
    batch = InputBatch(page_width=16, capacity=2, num_groups=groups)
    shared = list(range(100, 112))
    for i in range(8):
        n = 2 if i % 4 == 0 else 1
        params = SamplingParams(max_tokens=rng.randint(8, 30), n=n, ignore_eos=True)
        sched.add_request(Request(f"r{i}", shared + [i] * rng.randint(1, 6), params))
    nulls = 0

    def check(rows, idx):
        nonlocal nulls
        for i, r in enumerate(rows):
            for g, table in enumerate(batch.page_tables):
                want = r.page_ids if g == 0 else r.group_page_ids[g - 1]
                n = int(table.num_pages[idx[i]])
                assert table.table[idx[i], :n].tolist() == list(want), (r.request_id, g)
                nulls += want.count(0)

    _drive(sched, batch, rng, 400, check)
    assert nulls > 0  # the sliding groups gave pages back


def test_sampling_columns_equal_the_row_by_row_build():
    """Static columns gathered from the batch (any row order), seed counters, the
    rows that need their full state (penalties, min_tokens bans, bad words, grammar
    masks) and n > 1 fork rows give the tensors the explicit RowState build gives,
    also when rows leave the batch between launch and sampling; new grammar masks
    replace the ones taken."""
    batch = InputBatch(page_width=4)
    batch.eos_token_ids = (2,)
    kinds = {
        "greedy": sampling(SamplingParams(temperature=0.0)),
        "topp": sampling(SamplingParams(temperature=0.8, top_p=0.9, seed=5)),
        "pen": sampling(SamplingParams(temperature=0.7, presence_penalty=0.5,
                                       repetition_penalty=1.2)),
        "min": sampling(SamplingParams(temperature=1.0, top_k=7, min_tokens=4, min_p=0.1)),
        "bad": sampling(SamplingParams(temperature=0.9), bad_words=[[9], [4, 5]]),
        "fork": sampling(*[SamplingParams(n=3, temperature=1.0, seed=20 + i) for i in range(3)]),
    }
    outputs = {sid: [3 + i, 4, 5][:1 + i % 3] for i, sid in enumerate(kinds)}
    outputs["fork"] = []
    for sid, s in kinds.items():
        batch.add(sid, sid, 0, s, [1, 2, 3], outputs[sid], grammar=sid == "topp")
    order = ["fork", "min", "greedy", "pen", "bad", "topp"]
    first = batch.rows_of(order)
    counts = [len(outputs[sid]) + (1 if sid == "pen" else 0) for sid in order]
    R = 16
    counter = np.zeros(R, np.int32)
    counter[:len(order)] = counts
    bits = np.zeros((V + 31) // 32, np.uint32)
    bits[0] = 0b1110
    fork_rows = [(batch.index["fork"], 1), (batch.index["fork"], 2)]
    taken = batch.step_sampling(first, counter, fork_rows, {5: bits}, R, V, 32)
    batch.remove("fork")  # rows move after the step was taken (a deferred sampler)
    batch.remove("greedy")
    got = taken.tensors()
    rows = []
    for sid, n in zip(order, counts):
        s = kinds[sid]
        rows.append(RowState(s.params[0], [1, 2, 3], outputs[sid], s.fallback(0), (2,),
                             s.bad_words_ids, n - len(outputs[sid]),
                             bits if sid == "topp" else None))
    for i in (1, 2):
        s = kinds["fork"]
        rows.append(RowState(s.params[i], [1, 2, 3], [], s.fallback(i), (2,), []))
    want = build_sampling_tensors(rows, R, V, 32)
    for name in ("temperature", "greedy", "top_k", "top_p", "min_p", "key_data", "counter",
                 "presence", "frequency", "repetition", "hist_ids", "hist_counts",
                 "edit_ids", "edit_vals", "allowed_bits"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    for flag in ("all_greedy", "use_penalties", "use_edits", "use_allowed", "use_min_p",
                 "use_top_k_p"):
        assert getattr(got, flag) == getattr(want, flag), flag
    assert got.use_penalties and got.use_edits and got.use_allowed
    assert got.key_data[6].tolist() != got.key_data[7].tolist()  # forks: their own seeds
    other = np.zeros_like(bits)
    other[0] = 0b10000
    assert taken.tensors({5: other}).allowed_bits[5, 0] == 0b10000
