"""LangChain's official OpenAI integration (``langchain_openai.ChatOpenAI``) against a
real pagedjax server on the default SmolLM2 model: invoke with usage counted as
/tokenize counts the prompt, streaming equal to invoke at temperature 0,
``with_structured_output(method="json_schema")`` (response_format json_schema),
``bind_tools`` with a named tool_choice (arguments checked with jsonschema), the
async API, and bad requests raising the client's 4xx errors. Nothing here counts
tokens on the client side (tiktoken would download its encodings)."""

from __future__ import annotations

from typing import Literal

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("langchain_core")
jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

pytestmark = pytest.mark.slow

MAX_TOKENS = 16
MESSAGES = [SystemMessage("Be brief."), HumanMessage("Name three colours.")]
PLAIN = [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "Name three colours."}]


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


# A plain JSON schema needs additionalProperties false: without it JSON Schema allows
# any other key and SmolLM2 keeps adding keys until max_tokens (a pydantic model is
# made strict, additionalProperties false, by the openai client LangChain calls).
PERSON = dict(Person.model_json_schema(), additionalProperties=False)

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER}}


def _llm(server, **kw) -> ChatOpenAI:
    kw.setdefault("max_tokens", MAX_TOKENS)
    return ChatOpenAI(base_url=server.v1, api_key=server.api_key, model=server.model,
                      temperature=0, seed=0, max_retries=0, timeout=120, **kw)


def test_invoke_text_and_usage(server):
    msg = _llm(server).invoke(MESSAGES)
    assert isinstance(msg, AIMessage)
    assert isinstance(msg.content, str) and msg.content.strip()
    usage = msg.usage_metadata
    status, tok = server.raw("POST", "/tokenize", {"messages": PLAIN})
    assert status == 200, tok
    assert usage["input_tokens"] == tok["count"]
    assert 1 <= usage["output_tokens"] <= MAX_TOKENS
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    meta = msg.response_metadata
    assert meta["model_name"] == server.model
    assert meta["finish_reason"] in ("stop", "length")
    if meta["finish_reason"] == "length":
        assert usage["output_tokens"] == MAX_TOKENS
    server.wait_idle()


def test_stream_equals_invoke(server):
    llm = _llm(server, stream_usage=True)
    whole = llm.invoke(MESSAGES)
    chunks = list(llm.stream(MESSAGES))
    assert len(chunks) > 2  # really streamed, not one piece
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert merged.content == whole.content
    # stream_options.include_usage: the last chunk carries the same counts.
    assert merged.usage_metadata == whole.usage_metadata
    server.wait_idle()


@pytest.mark.parametrize("schema", [Person, PERSON],
                         ids=["pydantic", "json_schema"])
def test_with_structured_output_json_schema(server, schema):
    llm = _llm(server, max_tokens=60)
    out = llm.with_structured_output(schema, method="json_schema").invoke(
        "Describe a person as JSON.")
    if isinstance(schema, dict):
        assert isinstance(out, dict)
        jsonschema.validate(out, schema)
        Person.model_validate(out)
    else:
        assert isinstance(out, Person)  # pydantic validated it already
        jsonschema.validate(out.model_dump(), Person.model_json_schema())
    server.wait_idle()


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The weather in a city."""
    return f"18 degrees {unit} in {city}"


@pytest.mark.parametrize("weather_tool", [WEATHER_TOOL, get_weather], ids=["dict", "at_tool"])
def test_bind_tools_named_choice(server, weather_tool):
    # strict=True: LangChain adds additionalProperties false to the @tool's schema
    # (without it any extra key is valid and SmolLM2 keeps adding keys).
    llm = _llm(server, max_tokens=60).bind_tools([weather_tool], tool_choice="get_weather",
                                                 strict=weather_tool is get_weather)
    msg = llm.invoke("What is the weather in Paris?")
    assert isinstance(msg, AIMessage)
    assert not msg.invalid_tool_calls
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], WEATHER)
    if weather_tool is get_weather:
        assert get_weather.invoke(call["args"]).startswith("18 degrees")
    server.wait_idle()


def test_tool_result_round_trip(server):
    """The AIMessage with tool_calls and a ToolMessage go back to the server (assistant
    tool_calls with null content, role "tool") and the model answers in text."""
    question = HumanMessage("What is the weather in Paris?")
    forced = _llm(server, max_tokens=60).bind_tools([WEATHER_TOOL], tool_choice="get_weather")
    call_msg = forced.invoke([question])
    result = ToolMessage('{"temperature": 18}', tool_call_id=call_msg.tool_calls[0]["id"])
    answer = _llm(server).bind_tools([WEATHER_TOOL], tool_choice="none").invoke(
        [question, call_msg, result])
    assert isinstance(answer.content, str) and answer.content.strip()
    assert not answer.tool_calls
    # The call and its result reached the chat template: a longer prompt.
    assert answer.usage_metadata["input_tokens"] > call_msg.usage_metadata["input_tokens"]
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    server.wait_idle()


def test_bind_tools_streamed_call_equals_invoked(server):
    llm = _llm(server, max_tokens=60).bind_tools([WEATHER_TOOL], tool_choice="get_weather")
    whole = llm.invoke("What is the weather in Paris?")
    merged = None
    for c in llm.stream("What is the weather in Paris?"):
        merged = c if merged is None else merged + c
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == \
        [(c["name"], c["args"]) for c in whole.tool_calls]
    server.wait_idle()


def test_unknown_model_is_404(server):
    llm = ChatOpenAI(base_url=server.v1, api_key=server.api_key, model="no-such-model",
                     max_tokens=4, max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as e:
        llm.invoke("Hi")
    assert e.value.status_code == 404
    assert "no-such-model" in str(e.value)


def test_bad_request_is_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        _llm(server, max_tokens=0).invoke("Hi")
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as e:
        _llm(server).bind_tools([WEATHER_TOOL], tool_choice="not_a_tool").invoke("Hi")
    assert e.value.status_code == 400
    # No tool_choice means "auto": this server runs without --enable-auto-tool-choice.
    with pytest.raises(openai.BadRequestError) as e:
        _llm(server).bind_tools([WEATHER_TOOL]).invoke("Hi")
    assert e.value.status_code == 400 and "enable-auto-tool-choice" in str(e.value)


def test_wrong_key_is_401(server):
    llm = ChatOpenAI(base_url=server.v1, api_key="wrong", model=server.model,
                     max_tokens=4, max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as e:
        llm.invoke("Hi")
    assert e.value.status_code == 401


def test_async_batch_and_function_calling_structured_output(server):
    """ainvoke/abatch run concurrently on the server (continuous batching) and give the
    greedy text that invoke gives; with_structured_output(method="function_calling")
    goes through a named tool_choice."""
    import asyncio

    llm = _llm(server)
    prompts = ["Name three colours.", "Count to five.", "Say hello."]
    want = [llm.invoke(p).content for p in prompts]

    async def run():
        got = await llm.abatch(prompts)
        parts = [c.content async for c in llm.astream(prompts[0])]
        return got, "".join(parts)

    got, streamed = asyncio.run(run())
    assert [m.content for m in got] == want
    assert streamed == want[0]
    structured = _llm(server, max_tokens=60).with_structured_output(
        Person, method="function_calling", strict=True)
    assert isinstance(structured.invoke("Describe a person."), Person)
    server.wait_idle()
