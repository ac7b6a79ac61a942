"""/metrics with vLLM's names, read with prometheus_client's own text parser: every
name is there, and the values move by what a request did (its usage, its
finish reason, its token gaps). Preemptions are counted against the scheduler's
own preempted ids on a pool made too small, prefix-cache tokens against the pool's."""

from __future__ import annotations

import uuid

import pytest

from pagedjax.engine.metrics import EngineMetrics

pytestmark = pytest.mark.slow

VLLM_NAMES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:request_success_total", "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_count",
    "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
    "vllm:request_prompt_tokens_sum", "vllm:request_generation_tokens_sum"]


def parse(text: str) -> dict[tuple, float]:
    """{(sample name, finished_reason or None): value}, via prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("finished_reason"))] = s.value
    return out


def scrape(server) -> dict[tuple, float]:
    status, text = server.raw("GET", "/metrics")
    assert status == 200
    return parse(text)


def test_vllm_names_move_after_a_request(server):
    server.wait_idle()
    before = scrape(server)
    for name in VLLM_NAMES:
        assert any(k[0] == name for k in before), name
    prompt = f"Metrics probe {uuid.uuid4().hex}: the capital of France is"
    r = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=8,
                                           temperature=0.0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 8
    server.wait_idle()
    after = scrape(server)

    def delta(name, reason=None):
        return after.get((name, reason), 0.0) - before.get((name, reason), 0.0)

    assert delta("vllm:prompt_tokens_total") == r.usage.prompt_tokens
    assert delta("vllm:generation_tokens_total") == 8
    assert delta("vllm:request_success_total", "length") == 1
    assert delta("vllm:request_prompt_tokens_sum") == r.usage.prompt_tokens
    assert delta("vllm:request_generation_tokens_sum") == 8
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_time_per_output_token_seconds_count",
                 "vllm:request_queue_time_seconds_count"):
        assert delta(name) == 1, name
    assert delta("vllm:inter_token_latency_seconds_count") == 7  # 8 tokens, 7 gaps
    e2e, ttft = delta("vllm:e2e_request_latency_seconds_sum"), \
        delta("vllm:time_to_first_token_seconds_sum")
    itl = delta("vllm:inter_token_latency_seconds_sum")
    assert 0 < ttft <= e2e and itl == pytest.approx(e2e - ttft, rel=1e-6, abs=1e-6)
    assert after[("vllm:num_requests_running", None)] == 0
    assert after[("vllm:kv_cache_usage_perc", None)] == 0
    # A streamed request counts its whole output too (its outputs are deltas).
    chunks = list(server.client().completions.create(
        model=server.model, prompt=prompt, max_tokens=5, temperature=0.0, stream=True,
        extra_body={"ignore_eos": True}))
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) >= 1
    server.wait_idle()
    streamed = scrape(server)
    assert streamed[("vllm:request_generation_tokens_sum", None)] - \
        after[("vllm:request_generation_tokens_sum", None)] == 5
    assert streamed[("vllm:inter_token_latency_seconds_count", None)] - \
        after[("vllm:inter_token_latency_seconds_count", None)] == 4
    # The deprecated pagedjax: spellings carry the same values.
    assert after[("pagedjax:prompt_tokens_total", None)] == \
        after[("vllm:prompt_tokens_total", None)]


def test_preemptions_and_prefix_cache_counted():
    """A pool too small for 16 requests that share a long prefix, prefix caching on."""
    from pagedjax import LLM, SamplingParams

    llm = LLM(max_model_len=512, num_pages=24, max_num_seqs=16, max_num_batched_tokens=32,
              page_size=16, enable_prefix_caching=True)
    engine = llm.llm_engine
    sched = engine.scheduler
    seen: list[str] = []
    orig = sched.schedule

    def spy():
        out = orig()
        seen.extend(out.preempted_ids)
        return out

    sched.schedule = spy
    try:
        shared = "Once upon a time, in a land far away, there lived a wise old owl. " * 2
        llm.generate([shared + f"Request {i} tells a story about" for i in range(16)],
                     SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                     use_tqdm=False)
    finally:
        sched.schedule = orig
    assert seen, "the pool was meant to be too small: no preemption happened"
    m = EngineMetrics("m")
    m.update_engine(engine, 0)
    got = parse(m.render().decode())
    assert got[("vllm:num_preemptions_total", None)] == len(seen)
    st = engine.pool_stats()
    assert got[("vllm:prefix_cache_hits_total", None)] == st.prefix_hits > 0
    assert got[("vllm:prefix_cache_queries_total", None)] == st.prefix_queries >= st.prefix_hits
    m.update_engine(engine, 0)  # counters move by the engine's change only
    assert parse(m.render().decode())[("vllm:prefix_cache_hits_total", None)] == st.prefix_hits
