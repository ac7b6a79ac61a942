"""Tool calling in chat completions: the request fields and what a tool_choice means.

``tools`` is OpenAI's list of ``{"type": "function", "function": {"name",
"description", "parameters", "strict"}}``; ``tool_choice`` is ``"none"``,
``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``.
As in vLLM, a request with tools and no tool_choice means ``"auto"``, which
needs the server started with ``--enable-auto-tool-choice --tool-call-parser
NAME``.

``required`` and a named function are enforced with structured outputs:

* named: the output is that function's arguments, constrained to its
  ``parameters`` schema;
* required: the output is a JSON array of at least one call, each
  ``{"name": <one of the tool names>, "parameters": <that tool's arguments>}``
  (an ``anyOf`` with one branch per tool, so the arguments follow the schema
  of the tool named).

The parameter schemas are read with their objects closed (``closed_schema``)
and the JSON is compact unless a schema's ``x-guidance`` asks otherwise.

``auto`` leaves the output free and a tool parser (``tool_parsers``) reads
calls out of the model's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pagedjax.entrypoints.openai.closed_schema import closed
from pagedjax.entrypoints.openai.errors import OpenAIError, short
from pagedjax.sampling_params import StructuredOutputsParams

MAX_TOOLS = 128
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionDefinition(_Base):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: Optional[str] = Field(None, max_length=65536)
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ChatTool(_Base):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Base):
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(_Base):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class ToolFields(_Base):
    """The chat request fields this module reads."""

    tools: Optional[list[ChatTool]] = Field(None, max_length=MAX_TOOLS)
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tool fields ask for: ``mode`` is 'none', 'auto', 'required'
    or 'named' (then ``name``); ``tools`` are handed to the chat template."""

    mode: str
    tools: Optional[list[dict]] = None
    name: Optional[str] = None

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")


def _parameters(tool: ChatTool) -> dict:
    """The tool's parameter schema, its objects closed (``closed_schema``)."""
    return closed(tool.function.parameters) if tool.function.parameters is not None \
        else EMPTY_PARAMETERS


def plan_tools(req: ToolFields, auto_enabled: bool) -> ToolPlan:
    """The request's ToolPlan; OpenAIError 400 for a choice the request cannot have."""
    tools = req.tools or []
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if choice != "none" and not tools:
        raise OpenAIError("tool_choice needs a non-empty 'tools' list.", 400, param="tool_choice")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise OpenAIError("tool names must be unique.", 400, param="tools")
    dicts = [t.model_dump(exclude_none=True) for t in tools] or None
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise OpenAIError(f"tool_choice names the function {short(choice.function.name)}, "
                              f"which is not in tools ({names[:10]}).", 400, param="tool_choice")
        return ToolPlan("named", dicts, choice.function.name)
    if choice == "auto" and not auto_enabled:
        raise OpenAIError('"auto" tool choice requires --enable-auto-tool-choice and '
                          "--tool-call-parser to be set (or send tool_choice 'none', "
                          "'required' or a named function).", 400, param="tool_choice")
    return ToolPlan(choice, dicts)


def tool_schema(req: ToolFields, plan: ToolPlan) -> Optional[dict]:
    """The JSON schema that enforces a 'required' or 'named' plan, else None."""
    tools = req.tools or []
    if plan.mode == "named":
        return next(_parameters(t) for t in tools if t.function.name == plan.name)
    if plan.mode != "required":
        return None
    branches = [{"type": "object", "additionalProperties": False,
                 "required": ["name", "parameters"],
                 "properties": {"name": {"type": "string", "enum": [t.function.name]},
                                "parameters": _parameters(t)}} for t in tools]
    items = branches[0] if len(branches) == 1 else {"anyOf": branches}
    schema = {"type": "array", "minItems": 1, "items": items}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    asked = [_parameters(t)["x-guidance"] for t in tools
             if isinstance(_parameters(t).get("x-guidance"), dict)]
    if asked:  # a tool's own formatting options (whitespace) govern the whole array
        schema["x-guidance"] = asked[0]
    return schema


def tool_constraint(req: ToolFields, plan: ToolPlan) -> Optional[StructuredOutputsParams]:
    schema = tool_schema(req, plan)
    if schema is None:
        return None
    try:  # compact JSON; a schema's own "x-guidance" whitespace options still apply
        return StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    except ValueError as e:
        raise OpenAIError(f"the tools' parameter schemas cannot be used: {e}", 400,
                          param="tools") from e


def messages_for_template(messages: list[dict]) -> list[dict]:
    """Assistant ``tool_calls`` with their arguments as objects, as chat templates
    expect (vLLM does the same); arguments that are not JSON stay strings."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            m = dict(m, tool_calls=[_call_for_template(c) for c in calls])
        out.append(m)
    return out


def _call_for_template(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except ValueError:
            pass
    return dict(call, function=fn)
