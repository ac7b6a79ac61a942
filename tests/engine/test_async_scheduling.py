"""Overlapped steps (async_scheduling) give exactly the serial engine's outputs.

One mixed workload on the real default model with a small pool (preemption)
and a small token budget (chunked prefill): greedy, seeded sampling, stop
strings, max_tokens, n=2, prompt logprobs, an abort mid-run and prefix
caching. Run once with overlap and once without; every output must match
token for token and text for text, and no page may stay held.
"""

from __future__ import annotations

import pytest

from pagedjax import LLM, SamplingParams

PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "The three primary colors are",
    "Summarize the following text. " + "The cat sat on the mat and looked at the bird. " * 6,
    "List three fruits:",
    "The capital of France is",  # a prefix-cache hit
]


def _params():
    return [
        SamplingParams(temperature=0.0, max_tokens=24),
        SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=20),
        SamplingParams(temperature=0.0, max_tokens=40, stop=["\n\n", "return"]),
        SamplingParams(temperature=1.0, top_k=20, seed=3, max_tokens=16, n=2),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, prompt_logprobs=2),
        SamplingParams(temperature=0.7, min_p=0.05, seed=11, max_tokens=18),
        SamplingParams(temperature=0.0, max_tokens=30, stop=[","], include_stop_str_in_output=True),
        SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.2),  # serial steps
    ]


def _run(async_scheduling: bool):
    llm = LLM(max_model_len=256, num_pages=14, max_num_seqs=6, max_num_batched_tokens=32,
              page_size=16, enable_prefix_caching=True, async_scheduling=async_scheduling)
    engine = llm.llm_engine
    params = _params()
    for i, (p, sp) in enumerate(zip(PROMPTS, params)):
        engine.add_request(str(i), p, sp)
    engine.add_request("doomed", "An aborted request", SamplingParams(max_tokens=50,
                                                                      ignore_eos=True))
    finished, steps, preemptions = {}, 0, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        steps += 1
        if steps == 5:
            engine.abort_request("doomed")
        preemptions = max(preemptions, sum(r.num_preemptions
                                           for r in engine.scheduler.requests.values()))
    return finished, engine.pool_stats(), engine.core.num_overlapped_steps, preemptions


def _summary(out):
    return [(c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason,
             None if c.logprobs is None else [sorted((t, round(lp.logprob, 4))
                                                     for t, lp in d.items()) for d in c.logprobs])
            for c in out.outputs], (None if out.prompt_logprobs is None else
                                    [None if d is None else sorted(d) for d in out.prompt_logprobs])


@pytest.mark.slow
def test_overlap_on_and_off_give_identical_outputs():
    on, stats_on, overlapped_on, preempt_on = _run(True)
    off, stats_off, overlapped_off, preempt_off = _run(False)
    print(f"overlapped steps {overlapped_on} / {overlapped_off}; "
          f"preemptions {preempt_on} / {preempt_off}")
    # The set-up does what it claims: steps did overlap, the pool did preempt.
    assert overlapped_on > 0 and overlapped_off == 0
    assert preempt_on > 0 and preempt_off > 0
    assert set(on) == set(off) == {str(i) for i in range(len(PROMPTS))}
    for rid in off:
        assert _summary(on[rid]) == _summary(off[rid]), f"request {rid} differs"
    assert len(off["3"].outputs) == 2
    assert off["2"].outputs[0].stop_reason in ("\n\n", "return", None)
    for stats in (stats_on, stats_off):
        assert stats.used == 0 and stats.total_refs == 0, stats


@pytest.mark.slow
def test_parent_stopping_on_its_first_token_leaves_its_samples_running():
    """n=3: sample 0 stops on its first token (a stop token id) while samples 1 and 2
    go on; with overlapped steps the children must stay mapped to their request."""
    llm = LLM(max_model_len=128, num_pages=32, max_num_seqs=4, page_size=16)
    base = SamplingParams(n=3, temperature=3.0, seed=123, max_tokens=6, ignore_eos=True)
    first = llm.generate(["Once upon a time"], base, use_tqdm=False)[0]
    tok0 = first.outputs[0].token_ids[0]
    others = [c.token_ids[0] for c in first.outputs[1:]]
    assert tok0 not in others, "pick another seed: the samples share their first token"
    stop = SamplingParams(n=3, temperature=3.0, seed=123, max_tokens=6, ignore_eos=True,
                          stop_token_ids=[tok0])
    out = llm.generate(["Once upon a time"], stop, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [tok0] and out.outputs[0].finish_reason == "stop"
    for c, ref in zip(out.outputs[1:], first.outputs[1:]):
        # the children run to max_tokens unless they draw tok0 themselves
        n = ref.token_ids.index(tok0) + 1 if tok0 in ref.token_ids else len(ref.token_ids)
        assert c.token_ids == ref.token_ids[:n]
    assert llm.llm_engine.pool_stats().used == 0
