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


def test_allowed_ids_that_conflict_with_the_format_are_400(server):
    """allowed_token_ids beside a structured output that admit no common token: a 400
    naming allowed_token_ids, never a 500. Before the first token the request is refused;
    later (the first token fits, the second cannot) the non-streamed answer is a 400 and
    the stream ends with an OpenAI-shaped error event."""
    client = server.client()
    ids = server.raw("POST", "/tokenize", {"model": server.model, "prompt": "Hello, world",
                                           "add_special_tokens": False})[1]["tokens"]
    assert len(ids) >= 2
    regex = {"structured_outputs": {"regex": "Hello, world"}}
    # (allowed, where the conflict is, the token the grammar wanted there)
    for allowed, where, wanted in ((ids[1:2], "first output token", ids[0]),
                                   (ids[:1], "after 1 output token", ids[1])):
        with pytest.raises(openai.BadRequestError) as ei:
            client.completions.create(model=server.model, prompt="Say hello:", max_tokens=8,
                                      temperature=0.0,
                                      extra_body={**regex, "allowed_token_ids": allowed})
        err = ei.value.body
        assert ei.value.status_code == 400 and err["param"] == "allowed_token_ids", err
        assert "admit no common token" in err["message"] and where in err["message"], err
        assert f"ids {wanted})" in err["message"], err
    # Streamed, the conflict after the first token arrives as an error in the stream.
    status, body = server.raw("POST", "/v1/completions", {
        "model": server.model, "prompt": "Say hello:", "max_tokens": 8, "temperature": 0.0,
        "stream": True, "allowed_token_ids": ids[:1], **regex})
    assert status == 200
    events = [json.loads(line[6:]) for line in body.splitlines()
              if line.startswith("data: {")]
    errors = [e["error"] for e in events if "error" in e]
    assert errors and errors[0]["code"] == "conflicting_constraints", events
    r = client.completions.create(model=server.model, prompt="Say hello:", max_tokens=8,
                                  temperature=0.0, extra_body=regex)
    assert r.choices[0].text == "Hello, world"
