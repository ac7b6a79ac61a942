"""The core's per-sequence state (pagedjax/engine/sequences.py): joining, forgetting, the
batch rows each live sequence holds, and the steady / token-only sets that the core's
per-row loops trust without checks."""

from pagedjax.core.request import Request
from pagedjax.engine.sequences import RequestSampling, Sequences
from pagedjax.sampling_params import SamplingParams
from pagedjax.worker.input_batch import InputBatch


def sampling(n=1, logprobs=None, keep_topk=False, history=False):
    params = [SamplingParams(n=n, logprobs=logprobs)] * n
    return RequestSampling(params, 0, [], None, history, keep_topk, set())


def request(rid):
    return Request(rid, [1, 2, 3], SamplingParams())


def test_token_only_request_and_its_views_go_when_its_sequence_is_forgotten():
    seqs = Sequences(InputBatch(8))
    seqs.add(request("a"), sampling())
    assert seqs.token_only == {"a"} and seqs.root("a") == ("a", 0) and seqs.num_serial == 0
    assert len(seqs.batch) == 1
    seqs.steady.add("a")
    seqs.forget("a")
    assert "a" not in seqs.steady and not seqs.token_only and not seqs.sampling
    assert seqs.root("a") is None and len(seqs.batch) == 0
    assert seqs.request_of("a") == "a"  # forgotten during this step
    seqs.begin_step()
    assert seqs.request_of("a") is None
    seqs.forget("a")  # twice: nothing left to drop


def test_a_request_lives_while_any_of_its_sequences_does():
    seqs = Sequences(InputBatch(8))
    seqs.add(request("r"), sampling(n=2))
    assert not seqs.token_only  # two samples: its steps are not bare tokens
    seqs.join("r-1", "r", 1, request("r-1"))
    assert seqs.root("r-1") == ("r", 1) and len(seqs.batch) == 2
    seqs.topk["r-1"] = {3: -0.5}
    assert sorted(seqs.seq_ids("r")) == ["r", "r-1"]
    seqs.forget("r")
    assert seqs.seq_ids("r") == ["r-1"] and seqs.request_of("r-1") == "r"
    assert seqs.batch.index == {"r-1": 0}  # the batch condensed: its row moved up
    seqs.forget("r-1")
    assert seqs.seq_ids("r") == [] and "r" not in seqs.sampling and not seqs.topk


def test_serial_requests_are_counted_until_they_end():
    seqs = Sequences(InputBatch(8))
    seqs.add(request("beam"), sampling(keep_topk=True))
    seqs.add(request("pen"), sampling(history=True))
    seqs.add(request("lp"), sampling(logprobs=2))
    # token-only: how its output leaves the core, not how its steps run
    assert seqs.num_serial == 2 and seqs.token_only == {"pen"}
    seqs.forget("beam")
    assert seqs.num_serial == 1
    seqs.forget("pen")
    seqs.forget("lp")
    assert seqs.num_serial == 0 and not seqs.sampling
