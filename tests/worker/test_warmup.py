"""Warm-up (pagedjax/worker/warmup.py): every program compiled once, from a thread pool,
then nothing compiles; the sampler's program sharing changes no token; the C++
builds run on background threads.

A tiny random Llama with SmolLM2's tokenizer and vocabulary keeps the
compilations short.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from pagedjax import LLM, SamplingParams
from pagedjax.sample import sampler
from pagedjax.worker import warmup
from pagedjax.worker.plan import CompileCounter

KW = dict(max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64, num_pages=40,
          page_size=16)


def _workload(seed: int):
    """Prompts and sampling parameters of every warmed-up kind (and min-p / top-k,
    which share the temperature program on the CPU), n > 1 forks included."""
    rng = random.Random(seed)
    kinds = {"greedy": dict(temperature=0.0), "seeded": dict(temperature=1.0, seed=7),
             "top_p": dict(temperature=0.8, top_p=0.95, seed=1),
             "top_k": dict(temperature=0.8, top_k=50, seed=2),
             "min_p": dict(temperature=0.7, min_p=0.1, seed=3),
             "logprobs": dict(temperature=0.0, logprobs=5),
             "n2": dict(temperature=1.0, n=2, seed=4)}
    batches = []
    for _ in range(4):
        prompts, params = [], []
        for _ in range(rng.randint(1, 10)):
            n_tok = rng.choice([1, 2, 5, 16, 17, 40, 90])
            prompts.append([rng.randrange(3, 49152) for _ in range(n_tok)])
            kw = dict(max_tokens=rng.randint(1, 20), ignore_eos=True)
            kw.update(kinds[rng.choice(sorted(kinds))])
            params.append(SamplingParams(**kw))
        batches.append((prompts, params))
    return batches


def _tokens(llm, batches):
    return [[c.token_ids for o in llm.generate(p, sp, use_tqdm=False) for c in o.outputs]
            for p, sp in batches]


def test_concurrent_warmup_compiles_each_program_once_then_nothing(tiny_llama_dir, smollm2_gguf,
                                                                   tmp_path):
    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, compilation_cache_dir=str(tmp_path), **KW)
    runner = llm.llm_engine.runner
    jobs = warmup.compile_jobs(runner)
    c0, h0 = CompileCounter.count, CompileCounter.cache_hits
    runner.warmup(progress=False, workers=2)
    # At most one XLA compilation per distinct program (fewer when an earlier test in
    # this process compiled the same program: jax keeps compiled programs in memory,
    # e.g. the page copies, which depend only on the pool's shape), none read from
    # the (empty) disk cache; the workload below shows none was missed.
    assert 0 < CompileCounter.count - c0 <= len(jobs)
    assert CompileCounter.cache_hits - h0 == 0
    assert {k[0] for k in jobs} == {"model", "sampler", "copy"}
    assert sum(k[0] == "model" for k in jobs) == len(runner.warmup_shapes())
    c0, h0 = CompileCounter.count, CompileCounter.cache_hits
    warmed = _tokens(llm, _workload(0))
    assert CompileCounter.count - c0 == 0, repr(runner.shapes_seen)
    assert CompileCounter.cache_hits - h0 == 0  # jit's own caches, not the disk
    assert llm.llm_engine.pool_stats().used == 0
    # The same requests without warm-up (programs compiled by the calls): same tokens.
    cold = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, compilation_cache_dir=str(tmp_path), **KW)
    assert _tokens(cold, _workload(0)) == warmed


def test_warmup_rejects_bad_workers(tiny_llama_dir, smollm2_gguf):
    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, **KW)
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        llm.llm_engine.runner.warmup(progress=False, workers=0)


def test_sampler_rows_cover_prepare(tiny_llama_dir, smollm2_gguf):
    """Every (logits rows, sampling rows) pair a step of up to 2S sampling rows pads
    to is one warm-up compiles."""
    from pagedjax.worker.inputs import SampleRow
    from pagedjax.sample.sampler import RowState
    from pagedjax.core.scheduler import ScheduledRow

    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, **KW)
    runner = llm.llm_engine.runner
    pairs = set(warmup.sampler_rows(runner.max_num_seqs))
    g = SamplingParams(temperature=0.0, max_tokens=1)
    for n_rows in range(1, runner.max_num_seqs + 1):
        for decode in (True, False):
            rows = [ScheduledRow(f"r{i}", [5] * (1 if decode or i else 3), 0, [1], 1)
                    for i in range(n_rows)]
            for n_sample in {1, n_rows, 2 * n_rows}:
                srows = [SampleRow(f"r{j % n_rows}", j % n_rows, RowState(g, [5], []), None)
                         for j in range(n_sample)]
                _, st, idx, _, _, (t, s, p) = runner.prepare(rows, srows, {})
                assert len(idx) == len(st.greedy) >= max(8, s)
                assert (s, len(idx)) in pairs, (n_rows, decode, n_sample)


def test_program_flags_share_the_native_program_and_keep_tokens():
    from pagedjax.kernels_pallas.cpu import sampler as cpu_sampler
    from pagedjax.sample.sampler import RowState, build_sampling_tensors

    if not cpu_sampler.available():
        pytest.fail(f"the C++ sampler must build here: {cpu_sampler.unavailable_reason()}")
    V, R = 1000, 8
    rows = [RowState(SamplingParams(temperature=0.8, top_p=0.9, seed=1), [0], []),
            RowState(SamplingParams(temperature=0.7, min_p=0.2, seed=2), [0], []),
            RowState(SamplingParams(temperature=0.9, top_k=5, seed=3), [0], []),
            RowState(SamplingParams(temperature=0.0), [0], [])]
    st = build_sampling_tensors(rows, R, V, 64)
    assert st.use_top_k_p and st.use_min_p
    shared = sampler.program_flags(st, "native")
    plain = build_sampling_tensors([RowState(SamplingParams(temperature=1.0), [0], [])], R, V, 64)
    assert sampler.variant_key(shared) == sampler.variant_key(plain)
    assert sampler.program_flags(st, "xla") is st  # the jnp path needs its flags
    logits = np.random.default_rng(0).standard_normal((R, V)).astype(np.float32) * 3
    for counter in range(5):
        st.counter[:] = shared.counter[:] = counter
        a = sampler.sample_jit(logits, st, backend="native").token_ids
        b = sampler.sample_jit(logits, shared, backend="native").token_ids
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_library_builds_in_background(tmp_path, monkeypatch):
    from pagedjax.kernels_pallas.cpu import build as cpu_build

    monkeypatch.setenv("PAGEDJAX_CACHE_DIR", str(tmp_path))
    src = tmp_path / "bg_probe.cc"
    src.write_text('extern "C" int PagedjaxSelfTest() { return 0; }\n')
    lib = cpu_build.FfiLibrary(src, "bg_probe", {})
    t = lib.load_in_background()
    assert isinstance(t, threading.Thread) and t.daemon
    assert lib.load() is not None, lib.error  # waits for the background build
    t.join(60)
    info = cpu_build.build_info("bg_probe")
    assert info["cached"] is False and info["seconds"] > 0
    assert list((tmp_path / "native").glob("bg_probe_*.so"))
    again = cpu_build.FfiLibrary(src, "bg_probe", {})
    again.load_in_background().join(60)
    assert again.load() is not None and cpu_build.build_info("bg_probe")["cached"] is True
