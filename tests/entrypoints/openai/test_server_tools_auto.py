"""tool_choice "auto" through a server started with ``--enable-auto-tool-choice
--tool-call-parser hermes``, checked with the official ``openai`` client.

SmolLM2-135M does not write tool calls on its own, so a regex constraint
(vLLM's ``structured_outputs``) makes the real model write Hermes-format text;
the server's parser has to turn it into ``tool_calls``, streamed or not, and
give malformed calls back as plain content.
"""

from __future__ import annotations

import json

import pytest

from tests.utils.server import skip_without_model, start_server, stop_server
from tests.entrypoints.openai.test_server_tools import TOOLS, WEATHER

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

CALL = (r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", '
        r'"unit": "celsius"\}\}</tool_call>')


@pytest.fixture(scope="module")
def auto_server():
    skip_without_model()
    srv = start_server(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    try:
        yield srv
    finally:
        stop_server(srv)


def _chat(srv, regex, **kw):
    kw.setdefault("max_tokens", 60)
    return srv.client().chat.completions.create(
        model=srv.model, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS, temperature=0.0,
        extra_body={"structured_outputs": {"regex": regex}}, **kw)


def _stream(srv, regex):
    content, calls, finish = "", {}, None
    for ch in _chat(srv, regex, stream=True):
        for c in ch.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                calls.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("prefix", ["", r"Sure\. "])
def test_auto_parses_hermes_calls(auto_server, prefix):
    r = _chat(auto_server, prefix + CALL).choices[0]  # no tool_choice: "auto"
    assert r.finish_reason == "tool_calls"
    assert r.message.content == ("Sure." if prefix else None)
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER)
    content, calls, finish = _stream(auto_server, prefix + CALL)
    assert "<tool" not in content and content == (r.message.content or "")
    assert calls == [{"name": "get_weather", "arguments": call.function.arguments}]
    assert finish == "tool_calls"


def test_auto_two_calls(auto_server):
    r = _chat(auto_server, CALL + "\n" + CALL.replace("Paris|Rome", "Rome"),
              tool_choice="auto", max_tokens=120).choices[0]
    assert [json.loads(c.function.arguments)["city"] for c in r.message.tool_calls][-1] == "Rome"
    assert len(r.message.tool_calls) == 2 and r.message.content is None


@pytest.mark.parametrize("regex,text", [
    (r"Hello there", "Hello there"),
    (r'<tool_call>\{"name": oops\}</tool_call>', '<tool_call>{"name": oops}</tool_call>'),
    (r"<tool_ca", "<tool_ca"),  # a held-back prefix that never became a call
])
def test_auto_plain_or_malformed_is_content(auto_server, regex, text):
    r = _chat(auto_server, regex).choices[0]
    assert r.message.content == text and not r.message.tool_calls
    assert r.finish_reason == "stop"
    content, calls, finish = _stream(auto_server, regex)
    assert (content, calls, finish) == (text, [], "stop")
