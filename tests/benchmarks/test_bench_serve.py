"""``pagedjax bench serve`` (shipped in the package) against the shared server: the
report's counts agree with the workload, latencies are ordered, the JSON is
written; its workload and metric helpers on their own."""

from __future__ import annotations

import json

import pytest

from pagedjax.benchmarks.serve_data import random_requests, sharegpt_requests
from pagedjax.benchmarks.serve_metrics import RequestResult, parse_goodput, summarize


def test_workloads(tmp_path):
    reqs = random_requests(20, 16, 8, 0.5, seed=1)
    assert len(reqs) == 20 and all(8 <= r.prompt_words <= 24 and 4 <= r.output_len <= 12
                                   for r in reqs)
    assert random_requests(20, 16, 8, 0.5, seed=1) == reqs
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "a b c"}, {"from": "gpt",
                                                                  "value": "one two three"}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]}]))
    sg = sharegpt_requests(str(path), 3, seed=0)
    assert [r.prompt for r in sg] == ["a b c"] * 3 and sg[0].output_len == 4
    with pytest.raises(ValueError, match="range"):
        random_requests(1, 4, 4, 1.5, 0)


def test_metrics_and_goodput():
    rs = [RequestResult(True, 10, 5, ttft=0.1, e2el=0.5, itl=[0.1] * 4),
          RequestResult(True, 10, 3, ttft=0.3, e2el=0.5, itl=[0.1, 0.1]),
          RequestResult(False, error="HTTP 500")]
    rep = summarize(rs, 2.0, [50, 99], parse_goodput(["ttft:200"]))
    assert rep["completed"] == 2 and rep["failed"] == 1 and rep["total_output_tokens"] == 8
    assert rep["request_throughput"] == 1.0 and rep["request_goodput"] == 0.5
    assert rep["mean_ttft_ms"] == pytest.approx(200.0)
    assert rep["mean_tpot_ms"] == pytest.approx((100.0 + 100.0) / 2)
    with pytest.raises(ValueError, match="ttft, tpot or e2el"):
        parse_goodput(["latency:3"])


@pytest.mark.slow
def test_bench_serve_against_server(server, tmp_path):
    from pagedjax.entrypoints.cli import main

    out = tmp_path / "r.json"
    for endpoint in ("/v1/completions", "/v1/chat/completions"):
        rc = main(["bench", "serve", "--base-url", server.url, "--api-key", server.api_key,
                   "--endpoint", endpoint, "--num-prompts", "6", "--random-input-len", "12",
                   "--random-output-len", "6", "--max-concurrency", "3", "--request-rate", "20",
                   "--goodput", "e2el:600000", "--metric-percentiles", "50,99",
                   "--save-result", "--result-dir", str(tmp_path), "--result-filename",
                   out.name, "--disable-tqdm"])
        assert rc == 0
        rep = json.loads(out.read_text())
        assert rep["completed"] == 6 and rep["failed"] == 0
        assert rep["total_output_tokens"] == 36  # ignore_eos: every output has its length
        assert rep["request_goodput"] == pytest.approx(rep["request_throughput"])
        assert 0 < rep["p50_ttft_ms"] <= rep["p99_ttft_ms"]
        assert rep["mean_ttft_ms"] <= rep["mean_e2el_ms"] and rep["mean_itl_ms"] > 0
        assert all(x > 0 for x in rep["input_lens"]) and rep["max_concurrency"] == 3
    # two servers in one run (here the same one twice): one report each, compared
    rc = main(["bench", "serve", "--base-url", server.url, server.url + "/", "--label", "a",
               "b", "--api-key", server.api_key, "--num-prompts", "3",
               "--random-input-len", "8", "--random-output-len", "4", "--save-result",
               "--result-dir", str(tmp_path), "--result-filename", out.name, "--disable-tqdm"])
    assert rc == 0
    both = json.loads(out.read_text())["servers"]
    assert [r["label"] for r in both] == ["a", "b"]
    assert all(r["completed"] == 3 and r["total_output_tokens"] == 12 for r in both)
