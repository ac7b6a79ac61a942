"""Warm-up in the background (pagedjax/worker/compile_pool.py): requests are
served while the rarer programs compile, a step waits only for the program it
needs, and once the pool is done nothing compiles inside a step."""

from __future__ import annotations

import threading
import time

import pytest

from pagedjax import LLM, SamplingParams
from pagedjax.worker import warmup
from pagedjax.worker.compile_pool import CompilePool
from pagedjax.worker.plan import CompileCounter

KW = dict(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32, num_pages=24,
          page_size=16)


def _blocking_jobs(names, gates, log):
    """Jobs that record (name, thread) and, for names in ``gates``, wait for the gate."""
    def job(name):
        def run():
            log.append((name, threading.current_thread().name))
            if name in gates:
                assert gates[name].wait(10)
        return run
    return {n: job(n) for n in names}


def test_need_compiles_a_queued_program_in_the_step_without_waiting_for_others():
    gates = {"rare": threading.Event()}
    log: list = []
    pool = CompilePool(_blocking_jobs(["rare", "a", "b", "first"], gates, log), workers=1)
    deadline = time.time() + 10
    while not log and time.time() < deadline:  # the worker took "rare" and is stuck in it
        time.sleep(0.01)
    t0 = time.perf_counter()
    pool.need("first")  # queued behind "a", "b": run here, now
    assert time.perf_counter() - t0 < 5
    assert ("first", threading.current_thread().name) in log
    assert not pool.done.is_set() and pool.compiled_in_step == 1
    pool.need("not-a-warmup-program")  # returns at once
    gates["rare"].set()
    assert pool.wait(10) and pool.completed == pool.total == 4
    assert [n for n, _ in log].count("first") == 1  # each job ran once
    assert all(t.startswith("pagedjax-compile") for n, t in log if n != "first")


def test_need_waits_for_the_program_a_worker_is_building():
    gates = {"shared": threading.Event()}
    log: list = []
    pool = CompilePool(_blocking_jobs(["shared", "other"], gates, log), workers=1)
    while not log:
        time.sleep(0.01)
    waiter = threading.Thread(target=pool.need, args=("shared",))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # waiting for the worker's build, not building it again
    gates["shared"].set()
    waiter.join(10)
    assert not waiter.is_alive()
    assert pool.wait(10) and [n for n, _ in log].count("shared") == 1


def test_failed_job_is_left_to_its_step_and_the_pool_finishes():
    def boom():
        raise RuntimeError("no")

    done = []
    pool = CompilePool({"bad": boom, "ok": lambda: None}, workers=2, on_done=done.append)
    assert pool.wait(10) and pool.failed == ["bad"] and done == [pool]
    pool.need("bad")  # done: returns, the step's own call compiles it


def test_cancel_drops_the_jobs_not_started_and_finishes():
    gates = {"running": threading.Event()}
    log: list = []
    pool = CompilePool(_blocking_jobs(["running", "x", "y"], gates, log), workers=1)
    while not log:
        time.sleep(0.01)
    pool.cancel()
    assert not pool.done.is_set()  # the running job still runs
    gates["running"].set()
    assert pool.wait(10) and pool.cancelled == 2 and [n for n, _ in log] == ["running"]


def test_pool_rejects_bad_workers():
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        CompilePool({}, workers=0)


def _requests():
    prompts = [[5, 17, 300, 41], [9] * 20, [7, 8], list(range(3, 40))]
    params = [SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.95, seed=3, max_tokens=5,
                             ignore_eos=True, logprobs=2)]
    return prompts, params * 2


def _tokens(llm):
    return [o.outputs[0].token_ids for o in llm.generate(*_requests(), use_tqdm=False)]


def test_engine_serves_during_background_warmup_then_compiles_nothing(tiny_llama_dir,
                                                                      smollm2_gguf, tmp_path):
    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, background_compile=True,
              compilation_cache_dir=str(tmp_path), **KW)
    runner = llm.llm_engine.runner
    pool = runner.compile_pool
    assert pool is not None and pool.total == len(warmup.compile_jobs(runner))
    first = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=2),
                         use_tqdm=False)
    assert len(first[0].outputs[0].token_ids) == 2
    assert pool.wait(300) and not pool.failed
    c0 = CompileCounter.count
    served = _tokens(llm)
    assert CompileCounter.count - c0 == 0, runner.shapes_seen  # nothing compiles in a step
    # The same tokens as an engine that compiles each program on first use.
    plain = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, compilation_cache_dir=str(tmp_path), **KW)
    assert plain.llm_engine.runner.compile_pool is None
    assert _tokens(plain) == served


def test_compile_all_at_start_compiles_before_the_engine_returns(tiny_llama_dir, smollm2_gguf,
                                                                 tmp_path):
    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, compile_all_at_start=True,
              compilation_cache_dir=str(tmp_path), **KW)
    c0 = CompileCounter.count
    _tokens(llm)
    assert CompileCounter.count - c0 == 0


def test_start_settings_must_be_booleans(tiny_llama_dir):
    with pytest.raises(ValueError, match="background_compile must be True or False"):
        LLM(tiny_llama_dir, background_compile="yes")
