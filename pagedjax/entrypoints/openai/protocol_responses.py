"""OpenAI Responses API bodies (``POST /v1/responses``) as pydantic models.

The request model is validated like the others (unknown fields ignored, known
ones type and range checked, limits shown in ``/openapi.json``); the response
models only describe the API for the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pagedjax.entrypoints.openai.protocol import MAX_TEMPERATURE, Text

MAX_ITEMS = 4096


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionTool(_Base):
    """A Responses function tool: the function's fields at the top level."""

    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: Optional[str] = Field(None, max_length=65536)
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class FunctionChoice(_Base):
    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=64)


class TextFormat(_Base):
    """``text.format``: {"type": "text"}, {"type": "json_object"} or
    {"type": "json_schema", "name": .., "schema": {..}, "strict": ..}."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Optional[str] = Field(None, max_length=256)
    description: Optional[str] = Field(None, max_length=2048)
    json_schema: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class TextConfig(_Base):
    format: Optional[TextFormat] = None


InputItem = Annotated[dict[str, Any], Field(description=(
    "a message ({role, content}), a function_call ({call_id, name, arguments}) or a "
    "function_call_output ({call_id, output}); reasoning items are skipped"))]


class ResponsesRequest(_Base):
    model: Optional[str] = Field(None, max_length=256)
    input: Union[Text, Annotated[list[InputItem], Field(min_length=1, max_length=MAX_ITEMS)]]
    instructions: Optional[Text] = None
    max_output_tokens: Optional[int] = Field(None, ge=1, le=2**31 - 1)
    temperature: Optional[float] = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=-(2**63), le=2**64 - 1)
    tools: Optional[Annotated[list[FunctionTool], Field(max_length=128)]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], FunctionChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    previous_response_id: Optional[str] = Field(None, min_length=1, max_length=256)
    store: bool = True
    stream: bool = False
    metadata: Optional[Annotated[dict[str, Annotated[str, Field(max_length=512)]],
                                 Field(max_length=16)]] = None
    user: Optional[str] = Field(None, max_length=256)
    chat_template_kwargs: Optional[Annotated[dict[str, Any], Field(max_length=64)]] = None


# ---------------------------------------------------------------------- responses
class ResponseUsage(_Out):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponseObject(_Out):
    id: str
    object: Literal["response"]
    created_at: float
    model: str
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    output: list[dict[str, Any]]
    usage: Optional[ResponseUsage] = None


class DeletedResponse(_Out):
    id: str
    object: Literal["response.deleted"]
    deleted: bool
