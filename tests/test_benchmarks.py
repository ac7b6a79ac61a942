"""Smoke test of pagedjax/benchmarks/throughput.py: a tiny workload through every code path.

Uses a tiny random Llama (HF folder + the default model's tokenizer) so that
pagedjax, transformers static ``generate`` and transformers continuous
batching all run in seconds; the real-model numbers come from running the
script itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, smollm2_gguf):
    from pagedjax.engine.tokenizer import load_tokenizer

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    folder = tmp_path_factory.mktemp("bench_tiny") / "model"
    hf.save_pretrained(folder)
    load_tokenizer(smollm2_gguf).save_pretrained(folder)  # ids < 512 decode fine
    return str(folder)


def test_throughput_smoke(tiny_folder, tmp_path):
    from pagedjax.benchmarks import throughput

    out = tmp_path / "tp.json"
    rc = throughput.main(["--model", tiny_folder, "--num-requests", "5", "--input-mean", "8",
                          "--output-mean", "6", "--max-num-seqs", "8", "--hf-batch-size", "4",
                          "--sharing-output-len", "4", "--json", str(out), "--quiet"])
    assert rc == 0
    rep = json.loads(out.read_text())
    wl = rep["workload"]
    assert wl["num_requests"] == 5 and len(wl["output_lens"]) == 5
    m = rep["machine"]
    assert m["cpu"]["model"] and m["cpus"] >= 1 and m["versions"]["jax"]
    # Every system ran in a fresh process of its own, its load recorded around it.
    rd = rep["rounds"][0]
    assert rd["order"] == ["pagedjax", "hf_static", "hf_continuous"]
    pids = {name: r["process"]["pid"] for name, r in rd["systems"].items()}
    assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()
    assert all(len(r["process"]["loadavg_before"]) == 3 for r in rd["systems"].values())

    pj = rep["systems"]["pagedjax"]
    for key in ("output_tokens_per_s", "requests_per_s", "mean_ttft_ms", "mean_tpot_ms",
                "kv_waste_mean", "warmup_s", "compilations_after_warmup", "peak_pages_used"):
        assert key in pj, key
    assert pj["output_tokens"] == sum(wl["output_lens"])
    assert pj["compilations_after_warmup"] == 0
    assert pj["quantization"] is None and pj["weight_bytes"] > 0
    assert 0.0 <= pj["kv_waste_mean"] < 1.0
    prof = pj["step_profile"]  # per shape bucket: covers every step of the timed run
    assert sum(b["steps"] for b in prof) == pj["num_steps"]
    assert sum(b["tokens"] for b in prof) == pj["output_tokens"] + pj["input_tokens"] - wl["num_requests"]
    assert abs(sum(b["share"] for b in prof) - 1.0) < 1e-6
    assert all(b["mean_rows"] <= b["rows_bucket"] for b in prof)

    hs = rep["systems"]["hf_static"]
    assert "error" not in hs, hs
    assert hs["output_tokens"] == pj["output_tokens"] and hs["output_tokens_per_s"] > 0
    assert hs["generated_tokens_incl_padding"] >= hs["output_tokens"]
    assert hs["pagedjax_speedup"] > 0

    hc = rep["systems"]["hf_continuous"]  # a number, or the concrete error it hit
    assert ("error" in hc and hc["error"]) or hc["output_tokens"] == pj["output_tokens"]

    # Same weights, greedy, fp32: pagedjax and transformers mostly agree.
    assert rep["greedy_agreement_with_pagedjax"]["hf_static"] > 0.5

    sh = rep["sharing"]
    assert "error" not in sh, sh
    assert sh["n4"]["sequences"] == sh["independent"]["sequences"] == 32
    assert sh["n4"]["peak_pages_used"] < sh["independent"]["peak_pages_used"]
    assert sh["n4"]["peak_pages_saved_by_sharing"] > 0


def test_throughput_int8_smoke(tiny_folder, tmp_path, capsys):
    """--quantization int8 reaches pagedjax's LLM: int8 weights (~1/4 of the float file).
    Without the transformers baselines' script, pagedjax runs alone and says how to
    add them."""
    from pagedjax.benchmarks import throughput

    out = tmp_path / "tp_int8.json"
    rc = throughput.main(["--model", tiny_folder, "--num-requests", "3", "--input-mean", "8",
                          "--output-mean", "4", "--max-num-seqs", "4",
                          "--hf-baselines", str(tmp_path / "missing.py"),
                          "--skip-sharing", "--quantization", "int8", "--json", str(out),
                          "--quiet"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "from a checkout" in err and "--hf-baselines" in err and "pagedjax alone" in err
    rep = json.loads(out.read_text())
    assert list(rep["systems"]) == ["pagedjax"]
    assert rep["args"]["quantization"] == "int8"
    pj = rep["systems"]["pagedjax"]
    assert "error" not in pj, pj
    assert pj["quantization"] == "int8" and pj["compilations_after_warmup"] == 0
    assert pj["output_tokens"] == sum(rep["workload"]["output_lens"])
    float_bytes = sum(f.stat().st_size for f in Path(tiny_folder).glob("*.safetensors"))
    assert 0 < pj["weight_bytes"] < 0.3 * float_bytes


def test_hf_baselines_script_is_found_in_a_checkout_only(tmp_path):
    from pagedjax.benchmarks.throughput import HF_SCRIPT, find_hf_baselines
    from tests.utils.paths import REPO

    assert find_hf_baselines(str(tmp_path / "nope.py")) is None
    assert find_hf_baselines(cwd=str(tmp_path)) in (os.path.join(REPO, HF_SCRIPT), None)
    (tmp_path / "benchmarks" / "throughput").mkdir(parents=True)
    (tmp_path / HF_SCRIPT).write_text("")
    assert find_hf_baselines(cwd=str(tmp_path)) is not None


def test_throughput_rounds_alternate_and_combine():
    from pagedjax.benchmarks.throughput import _order, combine

    systems = ["pagedjax", "hf_static"]
    assert _order(systems, 0) == systems and _order(systems, 1) == systems[::-1]
    rounds = [{"pagedjax": {"output_tokens_per_s": 100.0}, "hf_static": {"output_tokens_per_s": 50.0}},
              {"pagedjax": {"output_tokens_per_s": 90.0}, "hf_static": {"output_tokens_per_s": 20.0}},
              {"pagedjax": {"output_tokens_per_s": 120.0}, "hf_static": {"error": "boom"}}]
    got = combine(rounds, systems)
    assert got["pagedjax"]["output_tokens_per_s"] == 100.0  # the median run
    assert got["pagedjax"]["runs_output_tokens_per_s"] == [100.0, 90.0, 120.0]
    # speedups are taken within a round (2x and 4.5x), never across rounds
    assert got["hf_static"]["pagedjax_speedup_per_round"] == [2.0, 4.5]
    assert got["hf_static"]["pagedjax_speedup"] == 3.25


def test_step_floor_smoke(tiny_folder, tmp_path):
    from benchmarks.step import step_floor

    out = tmp_path / "floor.json"
    rc = step_floor.main(["--model", tiny_folder, "--rows", "1,4", "--context", "40",
                          "--tokens", "32", "--prompt-chunk", "16", "--reps", "1",
                          "--json", str(out), "--quiet"])
    assert rc == 0
    rep = json.loads(out.read_text())
    kinds = [(r["kind"], r["rows"], r["tokens"]) for r in rep["steps"]]
    assert kinds == [("decode", 1, 1), ("decode", 4, 4), ("mixed", 2, 32)]
    for r in rep["steps"]:
        assert r["full_ms"] > 0 and r["no_attention_ms"] > 0


def test_step_floor_prices_a_profile():
    from benchmarks.step.step_floor import price_profile

    steps = [{"kind": "decode", "rows": 1, "tokens": 1, "no_attention_ms": 10.0},
             {"kind": "decode", "rows": 4, "tokens": 4, "no_attention_ms": 20.0},
             {"kind": "mixed", "rows": 8, "tokens": 512, "no_attention_ms": 400.0}]
    profile = [{"kind": "decode", "rows_bucket": 1, "tokens_bucket": 1, "steps": 3, "seconds": 0.5},
               {"kind": "decode", "rows_bucket": 2, "tokens_bucket": 2, "steps": 2, "seconds": 0.5},
               {"kind": "mixed", "rows_bucket": 8, "tokens_bucket": 256, "steps": 1, "seconds": 1.0}]
    got = price_profile(profile, steps)
    # 3 x 10 ms + 2 x 20 ms (2 rows priced at the next measured size, 4) + 400 ms x 256/512
    assert got["no_attention_floor_s"] == pytest.approx(0.030 + 0.040 + 0.200)
    assert got["measured_step_s"] == pytest.approx(2.0)


def test_sampler_benchmark_smoke(tiny_folder, tmp_path):
    from benchmarks.kernel_bench import sampler as bench

    out = tmp_path / "sampler.json"
    rc = bench.main(["--model", tiny_folder, "--rows", "8", "--logits", "flat", "--step-rows", "8",
                     "--context", "32", "--reps", "1", "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["vocab"] == 512 and rep["model_step"]["step_ms"] > 0
    got = {(r["logits"], r["rows"], r["mode"]) for r in rep["results"]}
    assert got == {("flat", 8, m) for m in bench.MODES}
    assert bench.make_logits("peaked", 2, 512).shape == (2, 512)
    assert all(r["before_ms"] > 0 and r.get("after_ms", 1) > 0 for r in rep["results"])


def test_step_profile_smoke(tiny_folder, tmp_path):
    from benchmarks.step import step_profile

    out = tmp_path / "profile.json"
    rc = step_profile.main(["--model", tiny_folder, "--rows", "2,4", "--context", "40",
                            "--reps", "1", "--rounds", "2", "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert [r["rows"] for r in rep["steps"]] == [2, 4]
    for r in rep["steps"]:
        for k in ("step_ms", "model_ms", "no_attention_ms", "lm_head_ms", "kv_write_ms",
                  "sample_greedy_ms", "sample_top_p_ms", "floor_ms"):
            assert r[k] > 0, k
        assert r["floor"]["layers_xla_ms"] > 0 and r["floor"]["lm_head_xla_ms"] > 0
        assert r["model_matmuls_ms"] > 0  # a Llama: its own projections, timed
        rounds = r["step_over_floor_rounds"]  # each round's own step / floor
        assert len(rounds) == 2 and all(x > 0 for x in rounds)
        assert r["step_over_floor"] == pytest.approx(float(np.median(rounds)))
    assert rep["shapes"]["hidden"] == 64 and rep["shapes"]["vocab"] == 512


def test_host_contention_smoke(tiny_folder, tmp_path):
    from benchmarks.step import host_contention

    out = tmp_path / "contention.json"
    rc = host_contention.main(["--model", tiny_folder, "--quantization", "none", "--context",
                               "40", "--duties", "0,0.25", "--steps", "5", "--rounds", "2",
                               "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert [r["duty"] for r in rep["results"]] == [0.0, 0.25]
    for r in rep["results"]:
        assert len(r["all_ms"]) == 2 and all(t > 0 for t in r["all_ms"])
        assert r["ms_per_step"] == pytest.approx(float(np.median(r["all_ms"])))
    assert rep["results"][0]["slowdown_ms"] == 0.0 and rep["results"][1]["ideal_slowdown_ms"] > 0


def test_step_profile_derives_parts():
    from benchmarks.step.step_profile import derive

    p = {"rows": 64, "step_ms": 300.0, "model_ms": 250.0, "no_attention_ms": 200.0,
         "lm_head_ms": 30.0, "kv_write_ms": 5.0, "sample_greedy_ms": 2.0}
    floor = {"layers_xla_ms": 120.0, "layers_cpp_ms": 100.0, "floor_ms": 150.0}
    d = derive(p, floor, native_rows=32)  # 64 rows > 32: the runner uses XLA's matmuls
    assert d["layers_matmul_path"] == "xla" and d["layers_matmul_ms"] == 120.0
    assert d["attention_ms"] == 50.0 and d["elementwise_ms"] == 45.0
    assert d["dispatch_host_ms"] == 48.0 and d["step_over_floor"] == 2.0
    assert derive(p, floor, native_rows=64)["layers_matmul_path"] == "cpp"
    own = derive(dict(p, model_matmuls_ms=90.0), floor, native_rows=32)  # the model's weights
    assert own["layers_matmul_path"] == "model" and own["elementwise_ms"] == 75.0


def test_host_overhead_smoke(smollm2_gguf, tmp_path):
    """benchmarks/host/host_overhead.py end to end on one tiny cell (a fresh child process)."""
    from benchmarks.host import host_overhead

    out = tmp_path / "host.json"
    rc = host_overhead.main(["--part", "host", "--rows", "2", "--contexts", "20", "--steps", "3",
                             "--processes", "2", "--out", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    (cell,) = rep["host"]
    assert cell["rows"] == 2 and cell["context"] == 20 and cell["steps"] == 3
    per = cell["host_cpu_ms_processes"]  # one median per fresh process; the cell: theirs
    assert cell["processes"] == 2 and len(per) == 2
    assert cell["host_cpu_ms_median"] == pytest.approx(float(np.median(per)))
    assert 0 < cell["host_ms_median"] <= cell["step_ms_median"] + 1e-6
    assert cell["device_wait_ms_median"] >= 0 and rep["machine"]["cores"] >= 1
    phases = cell["phase_ms"]  # every host phase was wrapped and ran inside the steps
    assert set(phases) == {"schedule", "prepare", "sampling_tensors", "update", "process"}
    assert all(v > 0 for v in phases.values())
    assert sum(phases.values()) - phases["sampling_tensors"] <= cell["step_ms_median"] * 1.5
    # the collector's time is counted exactly when it collected (per process, so in the
    # medians too)
    assert cell["gc_collections_per_step"] >= 0
    assert (cell["gc_collections_per_step"] > 0) == (cell["gc_ms_per_step"] > 0)
    # every decode step makes at least one output object per row
    assert cell["gc_tracked_allocations_per_step"] >= cell["rows"]
    assert len(cell["gc_tracked_allocations_processes"]) == 2
    # one traced step: every call runs at least a few bytecodes
    assert cell["python_bytecodes_per_step"] > 2 * cell["python_calls_per_step"] > 0
    assert len(cell["python_bytecodes_processes"]) == 2


def test_host_overhead_split_cores_child(tmp_path):
    """The overlap part's accelerator stand-in: a child whose engine thread runs on core 0
    and XLA on one thread elsewhere, with overlap on (a tiny 1k-vocabulary model)."""
    from benchmarks.host import host_overhead

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to give the device one of its own")
    folder = host_overhead.tiny_folder(str(tmp_path / "tiny"), 1024)
    r = host_overhead.run_child(dict(model=folder, rows=4, context=20, steps=3, vocab=1024,
                                     async_scheduling=True, split=True))
    first = min(os.sched_getaffinity(0))
    assert r["split"] is True and r["async"] is True and r["engine_thread_cores"] == [first]
    # XLA's threads (also any it started during the steps) stay off the engine's core.
    assert r["other_thread_cores"] and first not in r["other_thread_cores"]
    assert r["steps_per_s"] > 0 and r["step_ms_median"] > 0


def test_spec_decode_benchmark_smoke(tiny_folder, tmp_path):
    """benchmarks/features/spec_decode.py on one tiny cell per method, each in a fresh process;
    the draft is the tiny model's first layer written to a temporary HF folder."""
    from benchmarks.features import spec_decode

    out = tmp_path / "spec.json"
    rc = spec_decode.main(["--model", tiny_folder, "--workloads", "random", "--batches", "2",
                           "--methods", "off,ngram,draft", "--draft-layers", "1", "--k", "2",
                           "--output-len", "6", "--input-mean", "8", "--max-model-len", "128",
                           "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["machine"]["cpu"]["model"] and rep["draft"]["kind"].startswith("self-speculative")
    cells = {c["method"]: c for c in rep["cells"]}
    assert set(cells) == {"off", "ngram", "draft"}
    pids = {c["process"]["pid"] for c in cells.values()}
    assert len(pids) == 3 and os.getpid() not in pids
    for c in cells.values():
        assert "error" not in c, c
        assert c["num_requests"] == 2 and c["output_tokens"] > 0 and c["pages_used_after"] == 0
        assert c["greedy_agreement_with_off"] == 1.0, c["method"]
        assert len(c["process"]["loadavg_before"]) == 3
    assert cells["off"]["num_draft_tokens"] == 0 and cells["off"]["acceptance_rate"] is None
    d = cells["draft"]
    assert d["num_draft_tokens"] > 0 and 0.0 <= d["acceptance_rate"] <= 1.0
    assert 1.0 <= d["mean_accepted_length"] <= 3.0  # 1 + at most k accepted per verified row
    assert cells["off"]["output_tokens"] == d["output_tokens"] == cells["ngram"]["output_tokens"]


def test_cold_start_smoke(tiny_folder, tmp_path):
    """Cold then warm start in fresh processes: phases timed, nothing compiled after
    warm-up, the C++ builds found in the cache by the warm process."""
    from benchmarks.startup import cold_start as bench

    out = tmp_path / "cold_start.json"
    rc = bench.main(["--model", tiny_folder, "--max-num-seqs", "8", "--max-tokens", "4",
                     "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["ok"] is True and set(rep["results"]) == {"cold", "warm"}
    cold, warm = rep["results"]["cold"], rep["results"]["warm"]
    for res in (cold, warm):
        assert set(res["phases"]) == set(bench.PHASES)
        assert res["phases"]["generate"]["compilations"] == 0
        assert res["phases"]["warmup"]["compilations"] > 0
        assert all(p["wall_s"] >= 0 and p["cpu_s"] >= 0 for p in res["phases"].values())
    if cold["builds"]["cpu_sampler"]:  # built in the cold process, found in the warm one
        assert cold["builds"]["cpu_sampler"]["cached"] is False
        assert warm["builds"]["cpu_sampler"]["cached"] is True


def test_peer_serve_commands_and_comparison(tmp_path):
    """Both servers get the same GGUF and batch width; ratios are per round, pagedjax /
    llama.cpp, with their median."""
    from benchmarks.serving import peer_serve

    fake = tmp_path / "llama-server"
    fake.write_text("")
    ns = peer_serve.parse_args(["--llama-server", str(fake), "--model", "m.gguf",
                                "--parallel", "8", "--ctx", "128", "--threads", "2"])
    cmds = peer_serve.commands(ns, 9000)
    pj, ll = " ".join(cmds["pagedjax"]), cmds["llama.cpp"]
    assert "--model m.gguf" in pj and "--max-num-seqs 8" in pj and "--max-model-len 128" in pj
    assert ll[:3] == [str(fake), "-m", "m.gguf"] and ll[ll.index("-c") + 1] == "1024"
    assert ll[ll.index("-np") + 1] == "8" and "-cb" in ll and ll[ll.index("-t") + 1] == "2"

    def rep(x):
        return {k: x for k, _, _ in peer_serve.FIGURES}
    rounds = [{"order": ["pagedjax", "llama.cpp"], "pagedjax": rep(2.0), "llama.cpp": rep(1.0)},
              {"order": ["llama.cpp", "pagedjax"], "pagedjax": rep(3.0), "llama.cpp": rep(1.0)},
              {"order": ["pagedjax", "llama.cpp"], "pagedjax": rep(6.0), "llama.cpp": rep(3.0)}]
    cmp = peer_serve.compare(rounds)
    assert [r["output_throughput"] for r in cmp["ratio_per_round"]] == [2.0, 3.0, 2.0]
    assert cmp["ratio_median"]["output_throughput"] == 2.0
    assert cmp["median"]["pagedjax"]["request_throughput"] == 3.0
    assert "pagedjax/llama median" in peer_serve.table(cmp, rounds)


def test_hybrid_kv_benchmark_counts_pool_pages(tmp_path):
    """benchmarks/features/hybrid_kv.py (its scheduler part): the pool's used pages after
    a sequence, uniform vs hybrid, and each sliding group's window only."""
    from benchmarks.features import hybrid_kv

    out = tmp_path / "hkv.json"
    assert hybrid_kv.main(["--lengths", "4096", "--engine-lengths", "--chunk", "512",
                           "--json", str(out)]) == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    small = rows["gemma-3-270m"]
    assert small["uniform"]["pages"] == 4096 // 16 and small["uniform"]["arrays"] == 18
    # 256 pages of the full group + 5 sliding groups of ceil(511 / 16) + 1 pages
    assert small["hybrid"]["pages"] == 256 + 5 * 33 and small["hybrid"]["arrays"] == 3
    assert small["hybrid"]["bytes"] < 0.3 * small["uniform"]["bytes"]


def test_race_ratios_against_pagedjax_best_mode(tmp_path):
    """The offline race: each system's rate over the faster pagedjax mode of the same
    round; llama-server's batch width and context per slot; bad options named."""
    from benchmarks.serving import llama_server
    from benchmarks.throughput import race

    fake = tmp_path / "llama-server"
    fake.write_text("")
    ns = race.parse_args(["--llama-server", str(fake), "--model", "m.gguf", "--requests", "4",
                          "--systems", "pagedjax_f32,pagedjax_gguf,llama_16",
                          "--workloads", "long"])
    assert ns.systems == ["pagedjax_f32", "pagedjax_gguf", "llama_16"] and ns.gguf == "m.gguf"
    assert ns.workloads == ["long"] and ns.max_num_batched_tokens == 512
    for bad in (["--systems", "vllm"], ["--workloads", "short"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            race.parse_args(["--llama-server", str(fake), *bad])
    cmd = llama_server.command(str(fake), "m.gguf", 9000, slots=64, ctx=320, threads=2)
    assert cmd[cmd.index("-c") + 1] == str(64 * 320) and cmd[cmd.index("-np") + 1] == "64"
    assert "-cb" in cmd and cmd[cmd.index("-t") + 1] == "2"

    def r(x):
        return {"output_tokens_per_s": x, "weight_bytes": 2**20}
    rounds = [{"order": ["pagedjax_f32", "pagedjax_gguf", "llama_16"], "pagedjax_f32": r(100.0),
               "pagedjax_gguf": r(120.0), "llama_16": r(60.0)},
              {"order": ["llama_16", "pagedjax_gguf", "pagedjax_f32"], "pagedjax_f32": r(150.0),
               "pagedjax_gguf": {"system": "pagedjax_gguf", "error": "exited with 1"},
               "llama_16": r(50.0)}]
    cmp = race.compare(rounds, ns.systems)
    assert cmp["llama_16"]["vs_best_pagedjax"] == pytest.approx([0.5, 1 / 3])
    assert cmp["pagedjax_gguf"]["vs_best_pagedjax"] == [1.0]
    assert cmp["pagedjax_gguf"]["errors"] == ["exited with 1"]
    assert cmp["pagedjax_f32"]["tok_s_median"] == 125.0
    text = race.table("long", cmp, rounds)
    assert "llama_16" in text and "error" in text and "2.40x" in text


def test_race_compares_kv_caches_of_at_least_the_peers_size(tmp_path):
    """pagedjax with a float16 KV cache is measured against llama.cpp's float16 cache
    (its default, passed as -ctk/-ctv) but never against a float32 cache (llama.cpp's
    -ctk f32 or transformers'), where only pagedjax's float32-cache modes count."""
    from benchmarks.throughput import race

    fake = tmp_path / "llama-server"
    fake.write_text("")
    systems = "pagedjax_gguf,pagedjax_gguf_kv16,llama_16,llama_16_kv32,hf_static"
    ns = race.parse_args(["--llama-server", str(fake), "--model", "m.gguf", "--systems",
                          systems, "--workloads", "long", "--hf-baselines", __file__])
    rd = {"order": ns.systems, "pagedjax_gguf": {"output_tokens_per_s": 300.0},
          "pagedjax_gguf_kv16": {"output_tokens_per_s": 360.0},
          "llama_16": {"output_tokens_per_s": 180.0},
          "llama_16_kv32": {"output_tokens_per_s": 150.0},
          "hf_static": {"output_tokens_per_s": 50.0}}
    cmp = race.compare([rd], ns.systems)
    assert cmp["llama_16"]["vs_best_pagedjax"] == pytest.approx([0.5])  # vs float16 KV
    assert cmp["llama_16_kv32"]["vs_best_pagedjax"] == pytest.approx([0.5])  # vs float32 KV
    assert cmp["hf_static"]["vs_best_pagedjax"] == pytest.approx([50 / 300])
    assert race.rivals("llama_16_kv32") == ["pagedjax_f32", "pagedjax_gguf"]
    text = race.table("long", cmp, [rd])
    row = next(ln for ln in text.splitlines() if ln.startswith("pagedjax_gguf_kv16"))
    assert row.split()[-1] == "f16"
    assert race.LLAMA["llama_16_kv32"] == (16, "f32") and race.LLAMA["llama_16"] == (16, "f16")
