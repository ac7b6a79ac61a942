"""--reasoning-parser through the server, with the official ``openai`` client, on a
tiny scripted Qwen3 (tests/utils/reasoning_model): reasoning_content beside
content, whole and streamed; chat_template_kwargs turn thinking off; a JSON
schema and a forced tool call constrain only the answer after the thinking."""

from __future__ import annotations

import json

import pytest

from tests.utils.reasoning_model import ANSWER, THOUGHT, build_reasoning_model

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer"],
          "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}}
TOOL = {"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def rserver(tmp_path_factory):
    from tests.utils.server import skip_without_model, start_server, stop_server

    pytest.importorskip("openai")
    path = build_reasoning_model(str(tmp_path_factory.mktemp("reasoning_server")))
    srv = start_server(["--model", path, "--reasoning-parser", "qwen3"])
    try:
        yield srv
    finally:
        stop_server(srv)


def _chat(srv, **kw):
    kw.setdefault("messages", HI)
    kw.setdefault("max_tokens", 40)
    kw.setdefault("temperature", 0.0)
    return srv.client().chat.completions.create(model=srv.model, **kw)


def _stream(srv, **kw):
    reasoning, content, finish = "", "", None
    for ch in _chat(srv, stream=True, **kw):
        for c in ch.choices:
            d = c.delta
            extra = d.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += d.content or ""
            finish = c.finish_reason or finish
    return reasoning, content, finish


def test_reasoning_content_whole_and_streamed(rserver):
    m = _chat(rserver).choices[0].message
    assert (m.model_extra["reasoning_content"], m.content) == (THOUGHT, ANSWER)
    assert _stream(rserver) == (THOUGHT, ANSWER, "stop")


def test_chat_template_kwargs_turn_thinking_off(rserver):
    body = {"chat_template_kwargs": {"enable_thinking": False}}
    m = _chat(rserver, extra_body=body).choices[0].message
    assert (m.model_extra["reasoning_content"], m.content) == (None, ANSWER)
    assert _stream(rserver, extra_body=body) == ("", ANSWER, "stop")


def test_json_schema_after_thinking(rserver):
    # compact JSON (vLLM's field): this random model would write white space forever
    body = {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}}
    r = _chat(rserver, extra_body=body)
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == THOUGHT
    jsonschema.validate(json.loads(m.content), SCHEMA)
    reasoning, content, finish = _stream(rserver, extra_body=body)
    assert reasoning == THOUGHT and json.loads(content) == json.loads(m.content)


def test_tool_call_after_thinking(rserver):
    r = _chat(rserver, tools=[TOOL], tool_choice="required", parallel_tool_calls=False)
    c = r.choices[0]
    assert c.message.model_extra["reasoning_content"] == THOUGHT
    (call,) = c.message.tool_calls
    assert call.function.name == "answer" and c.finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    streamed = _chat(rserver, tools=[TOOL], tool_choice="required", parallel_tool_calls=False,
                     stream=True)
    reasoning, args = "", ""
    for ch in streamed:
        for ci in ch.choices:
            reasoning += (ci.delta.model_extra or {}).get("reasoning_content") or ""
            for tc in ci.delta.tool_calls or []:
                args += tc.function.arguments or ""
    assert reasoning == THOUGHT and json.loads(args) == json.loads(call.function.arguments)


def test_bad_chat_template_kwargs_is_400(rserver):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(rserver, extra_body={"chat_template_kwargs": {"messages": []}})
    assert e.value.body["param"] == "chat_template_kwargs"


def test_responses_reasoning_items(rserver):
    client = rserver.client()
    r = client.responses.create(model=rserver.model, input="hi", max_output_tokens=40,
                                temperature=0.0)
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].content[0].text == THOUGHT and r.output_text == ANSWER
    events = list(client.responses.create(model=rserver.model, input="hi", stream=True,
                                          max_output_tokens=40, temperature=0.0))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, text) == (THOUGHT, ANSWER)
    assert [o.type for o in events[-1].response.output] == ["reasoning", "message"]
    # a follow-up continues from the answer (the thinking is not sent back)
    r2 = client.responses.create(model=rserver.model, input="again", max_output_tokens=40,
                                 temperature=0.0, previous_response_id=r.id)
    assert r2.output_text == ANSWER and r2.usage.input_tokens > r.usage.input_tokens
