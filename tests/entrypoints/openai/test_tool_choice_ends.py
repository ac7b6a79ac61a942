"""Forced tool calls that end: ``tool_choice="required"`` with the default model and
a tool of two required fields gives a valid call (the calls written out in full
when ``max_tokens`` cuts a repeating array, with ``finish_reason="length"``);
``parallel_tool_calls=false`` gives exactly one; the constrained JSON is compact.
Also the readers keeping complete calls of a cut output, split at random points."""

from __future__ import annotations

import json
import random

import pytest

from pagedjax.entrypoints.openai.chat_tools import ChoiceTools
from pagedjax.entrypoints.openai.tool_parsers.constrained import RequiredCallsParser
from pagedjax.entrypoints.openai.tools import ToolFields, ToolPlan, plan_tools, tool_constraint

# What a new user writes: two required fields, no "additionalProperties".
WEATHER = {"type": "object", "required": ["city", "unit"],
           "properties": {"city": {"type": "string"},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "Get the current weather in a city"}}]
# With this question the default model repeats the call object until max_tokens.
BERLIN = [{"role": "user", "content": "Is it cold in Berlin today?"}]


def _compact(arguments: str) -> bool:
    return arguments == json.dumps(json.loads(arguments), separators=(",", ":"),
                                   ensure_ascii=False)


def _valid(call) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert _compact(call.function.arguments), call.function.arguments


# ---------------------------------------------------------------------- readers
CALLS = '[{"name":"f","parameters":{"a":"x}]","b":[1,2]}},{"name":"g","parameters":{"c":3}}]'


def test_cut_required_output_keeps_complete_calls():
    for end, n in ((len(CALLS), 2), (len(CALLS) - 1, 2), (len(CALLS) - 2, 1), (48, 1), (40, 0)):
        t = ChoiceTools(ToolPlan("required"))
        msg = t.message(CALLS[:end])
        assert [c["function"]["name"] for c in msg["tool_calls"]] == ["f", "g"][:n]
        assert (msg["content"] is None) == (n > 0)
        for c in msg["tool_calls"]:
            json.loads(c["function"]["arguments"])
    rng = random.Random(0)
    for _ in range(30):  # fed in random pieces: the same complete calls
        end = rng.randrange(1, len(CALLS) + 1)
        whole = RequiredCallsParser()
        whole.parse(CALLS[:end])
        p = RequiredCallsParser()
        cuts = sorted(rng.sample(range(1, end), min(4, end - 1))) if end > 1 else []
        for a, b in zip([0] + cuts, cuts + [end]):
            p.feed(CALLS[a:b])
        p.finish()
        assert p.complete_calls() == whole.complete_calls()


def test_cut_named_output_is_content():
    t = ChoiceTools(ToolPlan("named", name="f"))
    msg = t.message('{"a": "unfinish')
    assert msg["tool_calls"] == [] and msg["content"] == '{"a": "unfinish'
    assert ChoiceTools(ToolPlan("named", name="f")).message('{"a":1}')["tool_calls"]


def test_tool_constraint_compact_unless_schema_asks():
    req = ToolFields(tools=TOOLS, tool_choice="required")
    spec = tool_constraint(req, plan_tools(req, False))
    assert spec.disable_any_whitespace and "x-guidance" not in spec.json
    loose = dict(WEATHER, **{"x-guidance": {"whitespace_flexible": True}})
    req = ToolFields(tools=[{"type": "function", "function": {"name": "f", "parameters": loose}}],
                     tool_choice="required", parallel_tool_calls=False)
    spec = tool_constraint(req, plan_tools(req, False))
    assert spec.json["x-guidance"] == {"whitespace_flexible": True}
    assert spec.json["maxItems"] == 1


def test_closed_schema():
    from pagedjax.entrypoints.openai.closed_schema import closed

    s = {"type": "object", "properties": {"a": {"type": "object", "properties": {}},
                                          "b": {"type": "array", "items": {
                                              "anyOf": [{"properties": {"c": {}}}]}}},
         "$defs": {"d": {"type": "object", "properties": {"e": {}}}}}
    c = closed(s)
    assert c["additionalProperties"] is False
    assert c["properties"]["a"]["additionalProperties"] is False
    assert c["properties"]["b"]["items"]["anyOf"][0]["additionalProperties"] is False
    assert c["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in s  # the input is left as it is
    kept = {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}}
    assert closed(kept) == kept
    assert closed({"type": "object"}) == {"type": "object"}  # no properties: any object


# ---------------------------------------------------------------------- the default model
@pytest.mark.slow
def test_required_with_default_model_returns_valid_call(server):
    r = server.client().chat.completions.create(
        model=server.model, messages=BERLIN, tools=TOOLS, tool_choice="required",
        max_tokens=100, temperature=0.0)
    c = r.choices[0]
    assert c.message.tool_calls, f"no tool call: {c.message.content!r}"
    for call in c.message.tool_calls:
        _valid(call)
    assert c.message.content is None
    # cut by max_tokens inside a later call: the finish reason says so
    assert c.finish_reason == ("length" if r.usage.completion_tokens == 100 else "tool_calls")


@pytest.mark.slow
def test_parallel_false_gives_exactly_one_call(server):
    r = server.client().chat.completions.create(
        model=server.model, messages=BERLIN, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=100, temperature=0.0)
    c = r.choices[0]
    assert len(c.message.tool_calls) == 1 and c.finish_reason == "tool_calls"
    _valid(c.message.tool_calls[0])


@pytest.mark.slow
def test_named_choice_compact(server):
    r = server.client().chat.completions.create(
        model=server.model, messages=BERLIN, tools=TOOLS, max_tokens=100, temperature=0.0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    c = r.choices[0]
    assert len(c.message.tool_calls) == 1 and c.finish_reason == "stop"
    _valid(c.message.tool_calls[0])
