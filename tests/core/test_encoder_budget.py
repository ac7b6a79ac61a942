"""The scheduler's encoder budget: a step starts at most ``encoder_budget`` rows of
vision-encoder work (images beginning in its chunks); a chunk stops right before an
image that would overrun it, and a step with an untouched budget takes one image of
any size."""

from __future__ import annotations

from pagedjax.core.mm_item import MMItem, encoder_cut
from pagedjax.core.request import Request
from pagedjax.core.scheduler import Scheduler


class P:
    max_tokens = 4
    n = 1


def _req(rid: str, offsets: list[int], length: int, total: int) -> Request:
    r = Request(rid, list(range(3, 3 + total)), P())
    r.mm_items = tuple(MMItem(f"h{rid}{i}", o, length, None) for i, o in enumerate(offsets))
    return r


def test_encoder_cut_rules():
    items = (MMItem("a", 2, 10, None), MMItem("b", 20, 10, None))
    assert encoder_cut(items, 0, 40, 25, True) == (40, 20)  # both fit
    assert encoder_cut(items, 0, 40, 15, True) == (20, 10)  # stops before the second
    assert encoder_cut(items, 0, 40, 5, False) == (2, 0)  # stops before the first
    assert encoder_cut(items, 0, 40, 5, True) == (20, 10)  # fresh: one image of any size
    assert encoder_cut(items, 5, 10, 0, False) == (10, 0)  # image begun earlier: no cost


def test_scheduler_cuts_chunks_at_images_over_the_budget():
    s = Scheduler(num_pages=64, page_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                  max_model_len=128, encoder_budget=16)
    a = _req("a", [2, 20], 16, 40)  # two 16-row images
    b = _req("b", [1], 16, 20)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    rows = {r.request_id: r for r in out.rows}
    assert len(rows["a"].token_ids) == 20  # the second image waits for the next step
    assert rows["b"].token_ids == [3]  # stops before its image: over this step's budget
    s.update(out, {})
    out = s.schedule()
    rows = {r.request_id: r for r in out.rows}
    assert rows["a"].start_pos == 20 and len(rows["a"].token_ids) == 20
    assert "b" not in rows  # its image waits again: a's second image took the budget
    s.update(out, {"a": [7]})
    out = s.schedule()
    rows = {r.request_id: r for r in out.rows}
    assert rows["b"].start_pos == 1 and len(rows["b"].token_ids) == 19


def test_text_requests_unaffected():
    s = Scheduler(num_pages=64, page_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                  max_model_len=128, encoder_budget=16)
    r = Request("t", list(range(3, 43)), P())
    s.add_request(r)
    assert len(s.schedule().rows[0].token_ids) == 40
