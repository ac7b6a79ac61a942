"""OpenAI server: completions and chat through the official client (one real server)."""

from __future__ import annotations

import pytest

from tests.utils.server import SERVER_ARGS

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def expected_greedy():
    """Greedy texts from an in-process LLM with the server's settings."""
    from pagedjax import LLM, SamplingParams

    llm = LLM(**SERVER_ARGS)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    res = [(o.outputs[0].text, len(o.prompt_token_ids), len(o.outputs[0].token_ids)) for o in outs]
    del llm
    return res


def test_models_health_version(server):
    c = server.client()
    models = c.models.list().data
    assert [m.id for m in models] == [server.model]
    assert server.raw("GET", "/health", auth=False)[0] == 200
    st, body = server.raw("GET", "/version", auth=False)
    assert st == 200 and body["version"]


def test_greedy_matches_llm_generate_and_stream(server, expected_greedy):
    c = server.client()
    r = c.completions.create(model=server.model, prompt=PROMPTS, max_tokens=12, temperature=0)
    assert len(r.choices) == 2
    for ch, (text, plen, olen) in zip(sorted(r.choices, key=lambda x: x.index), expected_greedy):
        assert ch.text == text
    assert r.usage.prompt_tokens == sum(e[1] for e in expected_greedy)
    assert r.usage.completion_tokens == sum(e[2] for e in expected_greedy)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # Streaming gives the same text, split in deltas, and a usage chunk at the end.
    stream = c.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=12,
                                  temperature=0, stream=True,
                                  stream_options={"include_usage": True})
    parts, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            parts.append(ch.text)
            finish = ch.finish_reason or finish
    assert "".join(parts) == expected_greedy[0][0]
    assert len(parts) > 2 and finish == "length"
    assert usage.completion_tokens == expected_greedy[0][2]
    assert usage.prompt_tokens == expected_greedy[0][1]


def test_token_id_prompts_n2_logprobs_echo(server):
    c = server.client()
    ids = server.raw("POST", "/v1/completions", {"prompt": "Hello there", "max_tokens": 1,
                                                 "echo": True, "logprobs": 0})[1]
    tokens = ids["choices"][0]["logprobs"]["tokens"]
    assert ids["choices"][0]["text"].startswith("Hello there")
    assert ids["choices"][0]["logprobs"]["token_logprobs"][0] is None  # first prompt token
    r = c.completions.create(model=server.model, prompt=[[1, 2, 3, 4], [5, 6, 7]], n=2,
                             max_tokens=4, temperature=1.0, seed=3, logprobs=2)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == 7
    assert r.usage.completion_tokens == sum(len(ch.logprobs.tokens) for ch in r.choices)
    for ch in r.choices:
        lp = ch.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        assert all(2 <= len(t) <= 3 for t in lp.top_logprobs)
        assert all(x <= 0 for x in lp.token_logprobs)
        assert lp.text_offset[0] == 0 and "".join(lp.tokens) == ch.text
    assert len(tokens) == ids["usage"]["prompt_tokens"] + 1  # the prompt + one generated


def test_stop_and_seed(server):
    c = server.client()
    base = c.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=12,
                                temperature=0)
    text = base.choices[0].text
    stop = text.strip().split()[1] if len(text.split()) > 1 else text.strip()[:2]
    r = c.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=12,
                             temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text and text.startswith(r.choices[0].text)
    kw = dict(model=server.model, prompt="Once upon a time", max_tokens=8, temperature=1.0,
              seed=1234)
    a = c.completions.create(**kw).choices[0].text
    b = c.completions.create(**kw).choices[0].text
    assert a == b


def test_chat(server):
    c = server.client()
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    r = c.chat.completions.create(model=server.model, messages=msgs, max_tokens=8,
                                  temperature=0, logprobs=True, top_logprobs=2)
    ch = r.choices[0]
    assert ch.message.role == "assistant" and ch.message.content
    assert r.usage.completion_tokens == len(ch.logprobs.content)
    assert all(len(t.top_logprobs) == 2 for t in ch.logprobs.content)
    assert "".join(t.token for t in ch.logprobs.content).startswith(ch.message.content[:3])
    # Streaming, n=2, include_usage: deltas add up to the non-streamed text (greedy).
    stream = c.chat.completions.create(model=server.model, messages=msgs, max_tokens=8,
                                       temperature=0, n=2, stream=True,
                                       stream_options={"include_usage": True})
    texts, usage, roles = {0: "", 1: ""}, None, set()
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for d in chunk.choices:
            if d.delta.role:
                roles.add(d.index)
            texts[d.index] += d.delta.content or ""
    assert roles == {0, 1}
    assert texts[0] == texts[1] == ch.message.content
    assert usage.completion_tokens == 2 * r.usage.completion_tokens
    assert usage.prompt_tokens == r.usage.prompt_tokens
    # max_completion_tokens, stop, seed
    r2 = c.chat.completions.create(model=server.model, messages=msgs, max_completion_tokens=3,
                                   temperature=0.9, seed=5)
    r3 = c.chat.completions.create(model=server.model, messages=msgs, max_completion_tokens=3,
                                   temperature=0.9, seed=5)
    assert r2.choices[0].message.content == r3.choices[0].message.content
    assert r2.usage.completion_tokens <= 3


def test_metrics(server):
    # Generate something first: under pytest-xdist this may be the worker's first test.
    server.client().completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=3,
                                       temperature=0)
    m = server.wait_idle()
    for name in ("pagedjax:num_requests_running", "pagedjax:num_requests_waiting",
                 "pagedjax:kv_cache_usage_perc", "pagedjax:prefix_cache_hit_rate",
                 "pagedjax:kv_pages_held", "pagedjax:prompt_tokens_total",
                 "pagedjax:generation_tokens_total",
                 "pagedjax:time_to_first_token_seconds_count",
                 "pagedjax:time_per_output_token_seconds_count",
                 "pagedjax:e2e_request_latency_seconds_count"):
        assert name in m, name
    assert m["pagedjax:generation_tokens_total"] > 0
    assert m["pagedjax:e2e_request_latency_seconds_count"] > 0
