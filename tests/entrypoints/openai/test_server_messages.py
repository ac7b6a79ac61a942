"""POST /v1/messages (Anthropic's Messages API) with the official ``anthropic`` client:
text, system, stop sequences, streaming events, a forced tool_use and its
tool_result round trip, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import pytest

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "required": ["city", "unit"],
           "properties": {"city": {"type": "string"},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
TOOL = {"name": "get_weather", "description": "Get the current weather in a city",
        "input_schema": WEATHER}
GREEDY = {"temperature": 0.0}  # this client's create() no longer names temperature
BERLIN = [{"role": "user", "content": "Is it cold in Berlin today?"}]


def _client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=server.api_key, max_retries=0,
                               timeout=120.0)


def _create(server, **kw):
    kw.setdefault("max_tokens", 12)
    kw.setdefault("extra_body", GREEDY)
    kw.setdefault("messages", [{"role": "user", "content": "Say hello."}])
    return _client(server).messages.create(model=server.model, **kw)


def test_text_message_and_stream(server):
    m = _create(server, system="You are terse.")
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens <= 12
    with _client(server).messages.stream(model=server.model, max_tokens=12, extra_body=GREEDY,
                                         system="You are terse.",
                                         messages=[{"role": "user", "content": "Say hello."}]
                                         ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_delta" in kinds
    assert final.content[0].text == m.content[0].text  # greedy: same as non-streamed
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_stop_sequence(server):
    m = _create(server, max_tokens=40, stop_sequences=["o"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "o"


def test_tool_use_round_trip(server):
    jsonschema = pytest.importorskip("jsonschema")
    m = _create(server, messages=BERLIN, tools=[TOOL], max_tokens=60,
                tool_choice={"type": "any", "disable_parallel_tool_use": True})
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and m.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER)
    with _client(server).messages.stream(
            model=server.model, max_tokens=60, extra_body=GREEDY, messages=BERLIN, tools=[TOOL],
            tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = stream.get_final_message()
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(streamed.input, WEATHER)
    follow = _create(server, tools=[TOOL], messages=BERLIN + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id,
                                           "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": json.dumps({"temperature": 3})}]}],
        tool_choice={"type": "none"})
    assert follow.content[0].type == "text" and follow.usage.input_tokens > m.usage.input_tokens


def test_errors_in_anthropic_shape(server):
    with pytest.raises(anthropic.BadRequestError) as e:
        _create(server, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        _client(server).messages.create(model="no-such-model", max_tokens=2,
                                        messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    status, body = server.raw("POST", "/v1/messages", {"messages": []})
    assert status == 400 and body["type"] == "error" and "max_tokens" in body["error"]["message"]
