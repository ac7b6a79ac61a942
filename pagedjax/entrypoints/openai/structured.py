"""Structured-output request fields -> ``StructuredOutputsParams`` (both endpoints).

Accepted, like vLLM:

* OpenAI's ``response_format``: ``{"type": "text"}`` (no constraint),
  ``{"type": "json_object"}`` (any JSON object) and ``{"type": "json_schema",
  "json_schema": {"name": ..., "schema": {...}, "strict": ...}}`` (without a
  ``schema``: any JSON object). The schema is enforced whether ``strict`` is
  true or not: the sampler can only pick tokens the grammar allows.
* vLLM's ``structured_outputs``: ``{"json" | "regex" | "choice" | "grammar" |
  "json_object": ..., "disable_any_whitespace": bool}``;
* vLLM's older ``guided_json``, ``guided_regex``, ``guided_choice``,
  ``guided_grammar`` (plus ``guided_whitespace_pattern`` is ignored).

At most one of them per request. The spec is compiled (cached) in AsyncLLM's
worker pool before the request is queued, so a bad schema, regex or grammar
is a 400 naming the field that carried it, never a 500 or a hang. The server
compiles a new spec first in a compile worker process
(``structured_output/sandbox.py``): a spec that crashes the compiler, runs
over its time or memory budget or builds a lexer that fails on the first
tokens is a 400 too, and the server goes on serving; when every worker stays
busy for the time budget the answer is 503.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.sampling_params import SamplingParams, StructuredOutputsParams
from pagedjax.structured_output.sandbox import SandboxBusy

MAX_SPEC_CHARS = 2**20  # a regex or grammar
MAX_CHOICES = 256


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class JsonSchemaFormat(_Base):
    name: Optional[str] = Field(None, max_length=256)
    description: Optional[str] = Field(None, max_length=2048)
    json_schema: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Base):
    type: str = Field(description="'text', 'json_object' or 'json_schema'", max_length=32)
    json_schema: Optional[JsonSchemaFormat] = None


SpecText = Annotated[str, Field(min_length=1, max_length=MAX_SPEC_CHARS)]
Choices = Annotated[list[Annotated[str, Field(min_length=1, max_length=1024)]],
                    Field(min_length=1, max_length=MAX_CHOICES)]


class StructuredOutputsField(_Base):
    """vLLM's ``structured_outputs`` request field: exactly one constraint."""

    json_: Optional[Union[SpecText, dict[str, Any]]] = Field(None, alias="json")
    regex: Optional[SpecText] = None
    choice: Optional[Choices] = None
    grammar: Optional[SpecText] = None
    json_object: Optional[bool] = None
    disable_any_whitespace: bool = False


class StructuredFields(_Base):
    """The request fields this module reads (mixed into both request bodies)."""

    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputsField] = None
    guided_json: Optional[Union[SpecText, dict[str, Any]]] = None
    guided_regex: Optional[SpecText] = None
    guided_choice: Optional[Choices] = None
    guided_grammar: Optional[SpecText] = None


def _from_response_format(rf: ResponseFormat) -> Optional[StructuredOutputsParams]:
    if rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if rf.type == "json_schema":
        if rf.json_schema is None:
            raise OpenAIError("response_format of type 'json_schema' needs a 'json_schema' "
                              "object ({'name': ..., 'schema': {...}}).", 400,
                              param="response_format")
        schema = rf.json_schema.json_schema
        if schema is None:
            return StructuredOutputsParams(json_object=True)
        return StructuredOutputsParams(json=schema)
    raise OpenAIError(f"response_format type must be 'text', 'json_object' or 'json_schema', "
                      f"got {rf.type[:40]!r}.", 400, param="response_format")


def _candidates(req: StructuredFields):
    """(field name, a function building its StructuredOutputsParams or None)."""
    if req.response_format is not None:
        yield "response_format", lambda: _from_response_format(req.response_format)
    so = req.structured_outputs
    if so is not None:
        yield "structured_outputs", lambda: StructuredOutputsParams(
            json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar,
            json_object=so.json_object, disable_any_whitespace=so.disable_any_whitespace)
    for name, kw in (("guided_json", "json"), ("guided_regex", "regex"),
                     ("guided_choice", "choice"), ("guided_grammar", "grammar")):
        v = getattr(req, name)
        if v is not None:
            yield name, lambda kw=kw, v=v: StructuredOutputsParams(**{kw: v})


def structured_outputs_of(req: StructuredFields) -> tuple[Optional[StructuredOutputsParams],
                                                          Optional[str]]:
    """(the request's constraint or None, the field that carried it); OpenAIError 400
    for a malformed field or more than one constraint."""
    found = []
    for name, build in _candidates(req):
        try:
            spec = build()
        except ValueError as e:
            raise OpenAIError(str(e), 400, param=name) from e
        if spec is not None:
            found.append((name, spec))
    if len(found) > 1:
        raise OpenAIError("give at most one structured-output constraint; got "
                          f"{[k for k, _ in found]}.", 400, param=found[1][0])
    return (found[0][1], found[0][0]) if found else (None, None)


async def check_structured_outputs(llm, params: SamplingParams, field: Optional[str]) -> None:
    """Compile the request's constraint in the worker pool (cached); 400 if invalid."""
    if params.structured_outputs is None:
        return
    try:
        await llm.run_in_worker(llm.engine.compile_grammar, params)
    except ValueError as e:
        raise OpenAIError(str(e), 400, param=field or "structured_outputs") from e
    except SandboxBusy as e:
        raise OpenAIError(str(e), 503, type="server_error", code="service_unavailable") from e
