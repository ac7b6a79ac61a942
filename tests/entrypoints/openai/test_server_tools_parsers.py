"""The tool-call parsers on model-like text: Hermes and Llama 3 JSON, whole and fed
in pieces (every split gives the same calls), several calls, malformed output
as plain content; the readers of required / named outputs; ChoiceTools' shapes."""

from __future__ import annotations

import json
import random

import pytest

from pagedjax.entrypoints.openai.chat_tools import ChoiceTools
from pagedjax.entrypoints.openai.tool_parsers import TOOL_PARSERS, get_tool_parser
from pagedjax.entrypoints.openai.tool_parsers.constrained import (NamedCallParser,
                                                                  RequiredCallsParser)
from pagedjax.entrypoints.openai.tools import ToolPlan


def _summary(events):
    """(content, [(name, arguments as JSON)]) from parser events."""
    content, calls = "", []
    for kind, v in events:
        if kind == "content":
            content += v
        elif kind == "start":
            calls.append([v, ""])
        else:
            calls[-1][1] += v
    return content, [(n, json.loads(a)) for n, a in calls]


def _pieces(parser_cls, text, seed):
    rng = random.Random(seed)
    p, events, i = parser_cls(), [], 0
    while i < len(text):
        j = i + rng.randint(1, 7)
        events += p.feed(text[i:j])
        i = j
    return events + p.finish()


HERMES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
     '</tool_call>', ("", [("get_weather", {"city": "Paris", "unit": "celsius"})])),
    ('Let me check.\n<tool_call>{"name": "a", "arguments": {"x": "</tool"}}</tool_call>\n'
     '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
     ("Let me check.\n\n", [("a", {"x": "</tool"}), ("b", {})])),
    ('<tool_call>{"name": "f", "arguments": {"n": 1}}', ("", [("f", {"n": 1})])),  # cut at EOS
    ('<tool_call>{"name": "f", "arguments": {"n": 1</tool_call> ok',
     ('<tool_call>{"name": "f", "arguments": {"n": 1</tool_call> ok', [])),
    ('<tool_call>["not", "a call"]</tool_call>', ('<tool_call>["not", "a call"]</tool_call>', [])),
    ("The weather is <tool_ fine", ("The weather is <tool_ fine", [])),
    ("no calls here <tool_c", ("no calls here <tool_c", [])),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>', ("", [("f", {"a": 2})])),
]

LLAMA = [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}',
     ("", [("get_weather", {"city": "Paris"})])),
    ('<|python_tag|>{"name": "a", "parameters": {"q": "}{"}}; {"name": "b", "arguments": {}}',
     ("", [("a", {"q": "}{"}), ("b", {})])),
    ('  \n{"name": "f", "parameters": {"n": [1, 2]}}\n', ("", [("f", {"n": [1, 2]})])),
    ("The capital of France is Paris.", ("The capital of France is Paris.", [])),
    ('{"name": "f", "parameters": {"n": 1}', ('{"name": "f", "parameters": {"n": 1}', [])),
    ('{"city": "Paris"}', ('{"city": "Paris"}', [])),  # JSON, but not a call
    ('{"name": "f", "parameters": {}} and then prose',
     ("and then prose", [("f", {})])),
    ("<|python_", ("<|python_", [])),
]


@pytest.mark.parametrize("text,want", HERMES)
def test_hermes(text, want):
    cls = get_tool_parser("hermes")
    assert _summary(cls().parse(text)) == want
    for seed in range(20):
        assert _summary(_pieces(cls, text, seed)) == want


@pytest.mark.parametrize("text,want", LLAMA)
def test_llama3_json(text, want):
    cls = get_tool_parser("llama3_json")
    assert _summary(cls().parse(text)) == want
    for seed in range(20):
        assert _summary(_pieces(cls, text, seed)) == want


def test_registry():
    assert set(TOOL_PARSERS) >= {"hermes", "llama3_json"}
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("mistral9")


def test_required_reader_streams_raw_arguments():
    text = ('[{"name": "get_weather", "parameters": {"city": "Pa\\"ri}s", "n": [1, {"a": 2}]}},'
            ' {"parameters": {"tz": "UTC"}, "name": "get_time"}]')
    whole = RequiredCallsParser()
    events = whole.parse(text)
    assert whole.valid()
    content, calls = _summary(events)
    assert content == "" and calls == [("get_weather", {"city": 'Pa"ri}s', "n": [1, {"a": 2}]}),
                                       ("get_time", {"tz": "UTC"})]
    for seed in range(20):
        assert _pieces(RequiredCallsParser, text, seed) != [] and \
            _summary(_pieces(RequiredCallsParser, text, seed)) == (content, calls)
    cut = RequiredCallsParser()
    cut.parse(text[:40])
    assert not cut.valid()


def test_choice_tools_shapes():
    named = ChoiceTools(ToolPlan("named", name="f"))
    assert isinstance(named.parser, NamedCallParser)
    msg = named.message(' {"a": 1}')
    assert msg["content"] is None and msg["tool_calls"][0]["function"] == {
        "name": "f", "arguments": '{"a": 1}'}
    assert named.finish_reason("stop") == "stop"
    req = ChoiceTools(ToolPlan("required"))
    assert req.message('[{"name": "f", "parameters": {}}]')["tool_calls"][0]["type"] == "function"
    assert req.finish_reason("stop") == "tool_calls" and req.finish_reason("length") == "length"
    cut = ChoiceTools(ToolPlan("required"))
    assert cut.message('[{"name": "f", "param') == {"role": "assistant",
                                                    "content": '[{"name": "f", "param',
                                                    "tool_calls": []}
    auto = ChoiceTools(ToolPlan("auto"), "hermes")
    deltas = [auto.delta(t, False) for t in ("Hi ", "<tool", "_call>", '{"name": "g", ',
                                              '"arguments": {}}</tool_call>', "\n")]
    deltas.append(auto.delta("", True))
    # the trailing space is held: dropped because a call follows
    assert deltas[0] == {"content": "Hi"} and deltas[1] == deltas[2] == deltas[3] == {}
    (tc,) = deltas[4]["tool_calls"]
    assert tc["index"] == 0 and tc["id"].startswith("call_") and tc["function"] == {
        "name": "g", "arguments": "{}"}
    assert deltas[5] == deltas[6] == {}  # white space after a call is not content
    assert auto.finish_reason("stop") == "tool_calls"
    prose = ChoiceTools(ToolPlan("auto"), "hermes")
    assert [prose.delta(t, False) for t in ("a ", "b ")] == [{"content": "a"}, {"content": " b"}]
    assert prose.delta("", True) == {"content": " "}  # no call came: nothing is lost
    none = ChoiceTools(ToolPlan("none"))
    assert none.message("<tool_call>{}</tool_call>")["content"] == "<tool_call>{}</tool_call>"
