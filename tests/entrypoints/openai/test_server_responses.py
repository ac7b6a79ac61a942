"""POST /v1/responses with the official client's ``client.responses.create``: plain,
instructions and message input, streamed events, a tool round trip through
``previous_response_id``, ``text.format``, GET and DELETE, the bounded store, errors."""

from __future__ import annotations

import json

import pytest

from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.responses_store import ResponseStore, StoredResponse
from pagedjax.entrypoints.openai.serving_responses import ResponsesServing

openai = pytest.importorskip("openai")

WEATHER = {"type": "object", "required": ["city", "unit"],
           "properties": {"city": {"type": "string"},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER,
        "description": "Get the current weather in a city"}


def _create(server, **kw):
    kw.setdefault("max_output_tokens", 12)
    kw.setdefault("temperature", 0.0)
    return server.client().responses.create(model=server.model, **kw)


def _count(server, messages) -> int:
    status, body = server.raw("POST", "/tokenize", {"messages": messages})
    assert status == 200, body
    return body["count"]


# ---------------------------------------------------------------------- store (no server)
def test_store_is_bounded_and_can_be_off():
    store = ResponseStore(max_items=2)
    for i in range(3):
        store.put(StoredResponse({"id": f"r{i}"}, []))
    assert store.get("r0") is None and store.get("r1") and store.get("r2") and len(store) == 2
    off = ResponsesServing(None, ResponseStore(enabled=False))
    off.store.put(StoredResponse({"id": "x"}, []))
    with pytest.raises(OpenAIError) as e:
        off.retrieve("x")
    assert e.value.status == 404 and "disable-response-store" in e.value.message
    with pytest.raises(ValueError, match="max_items"):
        ResponseStore(max_items=0)


# ---------------------------------------------------------------------- server
@pytest.mark.slow
def test_plain_and_instructions(server):
    r = _create(server, input="Say hello.")
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.output_tokens <= 12 and r.usage.input_tokens > 0
    (msg,) = [o for o in r.output if o.type == "message"]
    assert msg.role == "assistant" and msg.content[0].type == "output_text"
    if r.status == "incomplete":
        assert r.usage.output_tokens == 12 and r.incomplete_details.reason == "max_output_tokens"
    r2 = _create(server, instructions="Answer in French.",
                 input=[{"role": "user", "content": [{"type": "input_text",
                                                      "text": "Say hello."}]}])
    # the instructions reached the prompt as a system message
    assert r2.usage.input_tokens == _count(server, [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Say hello."}])


@pytest.mark.slow
def test_streamed_events(server):
    whole = _create(server, input="Name a colour.")
    events = list(_create(server, input="Name a colour.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for k in ("response.output_item.added", "response.content_part.added",
              "response.output_text.delta", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"):
        assert k in kinds, k
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == whole.output_text  # greedy: same as non-streamed
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.slow
def test_tool_round_trip_with_previous_response(server):
    jsonschema = pytest.importorskip("jsonschema")
    r1 = _create(server, input="Is it cold in Berlin today?", tools=[TOOL],
                 tool_choice="required", parallel_tool_calls=False, max_output_tokens=60)
    (call,) = [o for o in r1.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    got = server.client().responses.retrieve(r1.id)
    assert got.id == r1.id and got.output[0].call_id == call.call_id
    r2 = _create(server, previous_response_id=r1.id, tools=[TOOL], tool_choice="none",
                 input=[{"type": "function_call_output", "call_id": call.call_id,
                         "output": json.dumps({"temperature": 3, "unit": "celsius"})}])
    assert r2.previous_response_id == r1.id and r2.output_text
    # the stored conversation (question, call, result) came before the new input
    assert r2.usage.input_tokens == _count(server, [
        {"role": "user", "content": "Is it cold in Berlin today?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id,
         "content": json.dumps({"temperature": 3, "unit": "celsius"})}])
    # streamed function call events
    events = list(_create(server, input="Is it cold in Berlin today?", tools=[TOOL],
                          tool_choice="required", parallel_tool_calls=False,
                          max_output_tokens=60, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args == done[0].arguments == call.arguments


@pytest.mark.slow
def test_text_format_and_delete(server):
    schema = {"type": "object", "additionalProperties": False, "required": ["ok"],
              "properties": {"ok": {"type": "boolean"}}}
    r = _create(server, input="Is water wet? Answer in JSON.", max_output_tokens=30,
                text={"format": {"type": "json_schema", "name": "a", "schema": schema}})
    assert isinstance(json.loads(r.output_text)["ok"], bool)
    client = server.client()
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    nostore = _create(server, input="hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(nostore.id)


@pytest.mark.slow
def test_bad_input_is_4xx(server):
    with pytest.raises(openai.NotFoundError) as e:
        _create(server, input="hi", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    for bad, param in (([{"type": "image_generation_call"}], "input"),
                       ([{"role": "wizard", "content": "x"}], "input"),
                       ([{"type": "function_call_output", "output": "x"}], "input")):
        with pytest.raises(openai.BadRequestError) as e:
            _create(server, input=bad)
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as e:
        _create(server, input="hi", max_output_tokens=10**6)
    assert e.value.body["param"] == "max_output_tokens"
    status, body = server.raw("POST", "/v1/responses", {"input": 3})
    assert status == 400 and set(body["error"]) >= {"message", "type", "param"}
