"""The core's per-sequence state (pagedjax/engine/sequences.py): joining, forgetting, and
the steady / plain views that the core's per-row loops trust without checks."""

from pagedjax.engine.sequences import RequestSampling
from pagedjax.sampling_params import SamplingParams
from pagedjax.engine.sequences import Sequences


def sampling(n=1, logprobs=None, keep_topk=False, history=False):
    params = [SamplingParams(n=n, logprobs=logprobs)] * n
    return RequestSampling(params, 0, [], None, history, keep_topk, set())


def test_plain_request_and_its_views_go_when_its_sequence_is_forgotten():
    seqs = Sequences()
    seqs.add("a", sampling())
    assert seqs.plain == {"a"} and seqs.root["a"] == ("a", 0) and seqs.num_serial == 0
    seqs.steady["a"] = object()
    seqs.forget("a")
    assert "a" not in seqs.steady and not seqs.plain and not seqs.sampling and not seqs.root
    assert seqs.request_of("a") == "a"  # forgotten during this step
    seqs.begin_step()
    assert seqs.request_of("a") is None
    seqs.forget("a")  # twice: nothing left to drop


def test_a_request_lives_while_any_of_its_sequences_does():
    seqs = Sequences()
    seqs.add("r", sampling(n=2))
    assert not seqs.plain  # two samples: not plain
    seqs.join("r-1", "r", 1)
    seqs.topk["r-1"] = {3: -0.5}
    assert sorted(seqs.seq_ids("r")) == ["r", "r-1"]
    seqs.forget("r")
    assert seqs.seq_ids("r") == ["r-1"] and seqs.request_of("r-1") == "r"
    seqs.forget("r-1")
    assert seqs.seq_ids("r") == [] and "r" not in seqs.sampling and not seqs.topk


def test_serial_requests_are_counted_until_they_end():
    seqs = Sequences()
    seqs.add("beam", sampling(keep_topk=True))
    seqs.add("pen", sampling(history=True))
    seqs.add("lp", sampling(logprobs=2))
    assert seqs.num_serial == 2 and seqs.plain == {"pen"}  # plain: its output, not its steps
    seqs.forget("beam")
    assert seqs.num_serial == 1
    seqs.forget("pen")
    seqs.forget("lp")
    assert seqs.num_serial == 0 and not seqs.sampling
