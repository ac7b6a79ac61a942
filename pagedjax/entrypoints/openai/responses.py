"""Response bodies as pydantic models: they only describe the API in /openapi.json.

The handlers build plain dicts; ``tests/entrypoints/openai/test_server_openapi.py`` runs
schemathesis, which checks every response against these schemas.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

from pagedjax.entrypoints.openai.protocol import ModelCard


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorInfo(_Out):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(_Out):
    error: ErrorInfo


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Out):
    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


class CompletionResponse(_Out):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    logprob: Optional[float] = None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[ChatTokenLogprob]


class ToolCallFunction(_Out):
    name: str
    arguments: str  # a JSON document, as a string


class ToolCall(_Out):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class ChatResponseMessage(_Out):
    role: Literal["assistant"]
    content: Optional[str] = None
    tool_calls: list[ToolCall] = []
    reasoning_content: Optional[str] = None  # with --reasoning-parser


class ChatChoice(_Out):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


class ChatCompletionResponse(_Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(_Out):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(_Out):
    prompt: str


class VersionResponse(_Out):
    version: str


def error_responses(*codes: int) -> dict:
    """FastAPI ``responses=`` entries declaring OpenAI-shaped errors."""
    what = {400: "Invalid request (the message names the parameter).",
            401: "Missing or wrong API key.", 403: "Host not allowed.",
            404: "Unknown model or route.", 413: "Request body too large.",
            415: "The body is not JSON.", 500: "The engine failed on this request.",
            503: "The server is shutting down, or the engine is not running."}
    return {c: {"model": ErrorResponse, "description": what[c]} for c in codes}
