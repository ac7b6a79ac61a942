"""``pagedjax bench serve`` (shipped in the package) against the shared server: the
report's counts agree with the workload, latencies are ordered, the JSON is
written; its workload and metric helpers on their own."""

from __future__ import annotations

import json

import pytest

from pagedjax.benchmarks.serve_data import (random_requests, sharegpt_length_requests,
                                             sharegpt_requests)
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
    lens = sharegpt_length_requests(400, 0.15, 128, seed=2)
    assert all(r.prompt_words + r.output_len <= 127 and r.output_len >= 1 for r in lens)
    mean_in = sum(r.prompt_words for r in lens) / len(lens)
    assert 0.7 * 161 * 0.15 < mean_in < 1.3 * 161 * 0.15  # ShareGPT's mean, scaled
    assert len({r.output_len for r in lens}) > 20  # long-tailed, not one length


def test_one_command_with_both_commands_options():
    """`bench serving` is `bench serve` with the older command's defaults; options of
    both parse on either name; conflicting ones are a clear error."""
    import argparse

    from pagedjax.benchmarks import serve
    from pagedjax.entrypoints import cli_extra

    root = argparse.ArgumentParser()
    cli_extra.register(root.add_subparsers(dest="command"))
    ns = root.parse_args(["bench", "serving", "--num-prompts", "3"])
    assert ns.dataset_name == "sharegpt-lengths" and ns.warmup_prompts == 4
    assert ns.request_rate == [0.5, 1.0, 2.0, float("inf")] and ns.num_prompts == 3
    ns = root.parse_args(["bench", "serve", "--request-rates", "1,inf", "--start-server",
                          "--server-args", "--max-num-seqs 4"])
    serve.check_args(ns)
    assert ns.request_rate == [1.0, float("inf")] and ns.start_server
    bad = root.parse_args(["bench", "serve", "--start-server", "--base-url", "http://x"])
    with pytest.raises(ValueError, match="not both"):
        serve.check_args(bad)


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
    # several request rates against one server: one run each, compared; a warm-up first
    rc = main(["bench", "serve", "--base-url", server.url, "--api-key", server.api_key,
               "--num-prompts", "2", "--random-input-len", "8", "--random-output-len", "3",
               "--request-rate", "50", "inf", "--warmup-prompts", "1", "--save-result",
               "--result-dir", str(tmp_path), "--result-filename", out.name, "--disable-tqdm"])
    assert rc == 0
    runs = json.loads(out.read_text())["servers"]
    assert [r["request_rate"] for r in runs] == [50.0, "inf"]
    assert all(r["completed"] == 2 and r["total_output_tokens"] == 6 for r in runs)


@pytest.mark.slow
def test_bench_serving_starts_its_own_server(tiny_llama_dir, smollm2_gguf, tmp_path, capsys):
    """The deprecated name with no --base-url: a pagedjax server started, measured at
    two rates, stopped."""
    from pagedjax.entrypoints.cli import main

    rc = main(["bench", "serving", "--server-args",
               f"--model {tiny_llama_dir} --tokenizer {smollm2_gguf} --max-model-len 128 "
               "--max-num-seqs 4 --num-pages 64 --log-level warning",
               "--num-prompts", "3", "--request-rate", "20", "inf", "--warmup-prompts", "1",
               "--sharegpt-lengths-max-len", "48", "--save-result", "--result-dir",
               str(tmp_path), "--result-filename", "s.json", "--disable-tqdm"])
    assert rc == 0
    assert "deprecated" in capsys.readouterr().err
    runs = json.loads((tmp_path / "s.json").read_text())["servers"]
    assert len(runs) == 2 and all(r["completed"] == 3 and r["failed"] == 0 for r in runs)
    assert all(r["label"].startswith("pagedjax (started)") for r in runs)
