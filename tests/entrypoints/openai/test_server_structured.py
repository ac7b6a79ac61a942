"""Structured outputs through the OpenAI server, checked with the official ``openai``
client and ``jsonschema``: response_format json_schema / json_object, vLLM's
``structured_outputs`` and ``guided_*`` fields, and 400s for bad specs."""

from __future__ import annotations

import json
import re

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


def _chat(client, model, question, **kw):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], temperature=0.0, **kw)


def test_response_format_json_schema(server):
    client = server.client()
    fmt = {"type": "json_schema",
           "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = _chat(client, server.model, "Describe a person as JSON.", max_tokens=100,
              response_format=fmt)
    c = r.choices[0]
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), PERSON)
    # Streamed: the deltas reassemble into a valid document too.
    chunks = _chat(client, server.model, "Describe your friend as JSON.", max_tokens=100,
                   response_format=fmt, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    jsonschema.validate(json.loads(text), PERSON)
    # json_object: any JSON object.
    r = _chat(client, server.model, "Return a JSON object with your name.", max_tokens=100,
              response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_structured_outputs_choice_regex_and_guided_fields(server):
    client = server.client()
    options = ["Paris", "London", "Berlin"]
    r = client.completions.create(model=server.model, prompt="The capital of France is",
                                  max_tokens=8, temperature=0.0,
                                  extra_body={"structured_outputs": {"choice": options}})
    assert r.choices[0].text in options and r.choices[0].finish_reason == "stop"
    pattern = r"[0-9]{3}-[0-9]{4}"
    r = _chat(client, server.model, "Give me a phone number.", max_tokens=20,
              extra_body={"guided_regex": pattern})
    assert re.fullmatch(pattern, r.choices[0].message.content)
    r = client.completions.create(model=server.model, prompt="A person in JSON:",
                                  max_tokens=100, temperature=0.0,
                                  extra_body={"guided_json": PERSON})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    r = _chat(client, server.model, "Yes or no?", max_tokens=5,
              extra_body={"structured_outputs": {"grammar": 'start: "yes" | "no"'}})
    assert r.choices[0].message.content in ("yes", "no")


@pytest.mark.parametrize("kw,param", [
    (dict(response_format={"type": "json_schema",
                           "json_schema": {"name": "x", "schema": {"type": "objectx"}}}),
     "response_format"),
    (dict(extra_body={"structured_outputs": {"regex": "(unclosed"}}), "structured_outputs"),
    (dict(extra_body={"guided_grammar": "start: nowhere"}), "guided_grammar"),
    (dict(extra_body={"structured_outputs": {"choice": []}}), None),
    (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["a"]}}),
     "structured_outputs"),
    (dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a+"}),
     "guided_regex"),
    (dict(response_format={"type": "yaml"}), "response_format"),
])
def test_bad_specs_are_400_with_openai_shape(server, kw, param):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as ei:
        _chat(client, server.model, "Hello", max_tokens=4, **kw)
    assert ei.value.status_code == 400
    err = ei.value.body
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param, err
    # The server still answers, and nothing is left running.
    r = _chat(client, server.model, "Hi", max_tokens=2)
    assert r.choices[0].message.content is not None
