"""Tool calling through the OpenAI server, checked with the official ``openai`` client
and ``jsonschema``: tool_choice "required" and a named function (enforced by
structured outputs), streamed tool-call deltas that reassemble into the
non-streamed call, "none", the tools reaching the chat template, and 400s."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["timezone"],
        "properties": {"timezone": {"type": "string", "maxLength": 30}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "The weather in a city."}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME,
                                           "description": "The time in a time zone."}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def _chat(server, **kw):
    kw.setdefault("messages", QUESTION)
    kw.setdefault("max_tokens", 120)
    kw.setdefault("temperature", 0.0)
    return server.client().chat.completions.create(model=server.model, **kw)


def _check_calls(calls):
    assert calls, "no tool call"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    assert len({c.id for c in calls}) == len(calls)


def _reassemble(chunks) -> tuple[dict, list]:
    """Streamed tool-call deltas -> {index: {id, name, arguments}}; also every delta."""
    calls: dict[int, dict] = {}
    seen = []
    for ch in chunks:
        for choice in ch.choices:
            d = choice.delta
            assert not d.content, f"content {d.content!r} streamed with a forced tool call"
            for tc in d.tool_calls or []:
                seen.append(tc)
                if tc.index not in calls:  # the first delta of a call names it
                    assert tc.id and tc.type == "function" and tc.function.name, tc
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None, tc
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            if choice.finish_reason is not None:
                calls.setdefault("finish", choice.finish_reason)
    return calls, seen


def test_required_tool_call_validates(server):
    r = _chat(server, tools=TOOLS, tool_choice="required")
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    _check_calls(c.message.tool_calls)


def test_named_tool_choice(server):
    r = _chat(server, tools=TOOLS,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    c = r.choices[0]
    assert c.finish_reason == "stop"  # OpenAI and vLLM keep 'stop' for a named function
    assert [t.function.name for t in c.message.tool_calls] == ["get_time"]
    _check_calls(c.message.tool_calls)


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_call_reassembles(server, choice):
    ref = _chat(server, tools=TOOLS, tool_choice=choice, seed=7).choices[0]
    calls, seen = _reassemble(_chat(server, tools=TOOLS, tool_choice=choice, seed=7,
                                    stream=True))
    assert calls.pop("finish") == ref.finish_reason
    want = [(t.function.name, t.function.arguments) for t in ref.message.tool_calls]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == want
    assert len(seen) > len(want)  # the arguments came in pieces


def test_tool_choice_none_gives_content(server):
    r = _chat(server, tools=TOOLS, tool_choice="none", max_tokens=16)
    c = r.choices[0]
    assert isinstance(c.message.content, str) and c.message.content
    assert not c.message.tool_calls
    assert c.finish_reason in ("stop", "length")


def test_tools_reach_the_chat_template(server):
    """A template that lists the tools gets them; SmolLM2's own template ignores them
    (as in transformers, which vLLM calls the same way)."""
    tmpl = ("{% for t in tools %}tool {{ t.function.name }}\n{% endfor %}"
            "{% for m in messages %}{{ m.content }}\n{% endfor %}")
    with_tools = _chat(server, tools=TOOLS, tool_choice="none", max_tokens=1,
                       extra_body={"chat_template": tmpl}).usage.prompt_tokens
    without = _chat(server, max_tokens=1, extra_body={
        "chat_template": tmpl.replace("{% for t in tools %}", "{% for t in [] %}")}
    ).usage.prompt_tokens
    assert with_tools > without
    own = [_chat(server, max_tokens=1, **kw).usage.prompt_tokens
           for kw in (dict(tools=TOOLS, tool_choice="none"), {})]
    assert own[0] == own[1]


def test_tool_results_in_the_history(server):
    """A second turn: the assistant's call and the tool's answer in the messages."""
    first = _chat(server, tools=TOOLS, tool_choice="required").choices[0].message
    call = first.tool_calls[0]
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    r = _chat(server, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.content


@pytest.mark.parametrize("kw,param", [
    (dict(tools=TOOLS), "tool_choice"),  # auto needs --enable-auto-tool-choice
    (dict(tools=TOOLS, tool_choice="auto"), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}],
          tool_choice="required"), "tools"),
    (dict(tools=TOOLS + TOOLS[:1], tool_choice="required"), "tools"),
    (dict(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "objectx"}}}], tool_choice="required"), "tools"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
     "tool_choice"),
])
def test_bad_tool_requests_are_400(server, kw, param):
    with pytest.raises(openai.BadRequestError) as ei:
        _chat(server, max_tokens=4, **kw)
    err = ei.value.body
    assert ei.value.status_code == 400 and err["type"] == "invalid_request_error"
    assert err["param"] == param, err


def test_required_with_n_samples_each_validates(server):
    """Sampled (each choice its own reader); parallel_tool_calls=false: one call each."""
    r = _chat(server, tools=TOOLS, tool_choice="required", n=3, temperature=0.9, seed=3,
              parallel_tool_calls=False, max_tokens=200)
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c
        assert len(c.message.tool_calls) == 1
        _check_calls(c.message.tool_calls)


def test_required_cut_by_max_tokens_is_content(server):
    """A call cut short is not a call: its text comes back as content, no crash."""
    r = _chat(server, tools=TOOLS, tool_choice="required", max_tokens=5)
    c = r.choices[0]
    assert c.finish_reason == "length" and not c.message.tool_calls
    assert c.message.content and c.message.content.lstrip().startswith("[")
