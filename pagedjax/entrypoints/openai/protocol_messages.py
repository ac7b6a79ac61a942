"""Anthropic Messages API bodies (``POST /v1/messages``) as pydantic models."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pagedjax.entrypoints.openai.protocol import Text


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


Block = Annotated[dict[str, Any], Field(description=(
    "a content block: text {text}, tool_use {id, name, input} or tool_result "
    "{tool_use_id, content}"))]


class AnthropicMessage(_Base):
    role: Literal["user", "assistant"]
    content: Union[Text, Annotated[list[Block], Field(max_length=4096)]]


class AnthropicTool(_Base):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: Optional[str] = Field(None, max_length=65536)
    input_schema: dict[str, Any]


class AnthropicToolChoice(_Base):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = Field(None, min_length=1, max_length=64)
    disable_parallel_tool_use: Optional[bool] = None


class MessagesRequest(_Base):
    model: Optional[str] = Field(None, max_length=256)
    max_tokens: int = Field(ge=1, le=2**31 - 1)
    messages: Annotated[list[AnthropicMessage], Field(min_length=1, max_length=4096)]
    system: Optional[Union[Text, Annotated[list[Block], Field(max_length=64)]]] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1, le=2**31 - 1)
    stop_sequences: Optional[Annotated[list[Annotated[str, Field(min_length=1,
                                                                 max_length=1024)]],
                                       Field(max_length=64)]] = None
    stream: bool = False
    tools: Optional[Annotated[list[AnthropicTool], Field(max_length=128)]] = None
    tool_choice: Optional[AnthropicToolChoice] = None
    metadata: Optional[dict[str, Any]] = None


class AnthropicUsage(_Out):
    input_tokens: int
    output_tokens: int


class MessagesResponse(_Out):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]
    stop_reason: Optional[str] = None
    stop_sequence: Optional[str] = None
    usage: AnthropicUsage


class AnthropicErrorInfo(_Out):
    type: str
    message: str


class AnthropicError(_Out):
    type: Literal["error"]
    error: AnthropicErrorInfo
