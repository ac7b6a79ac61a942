"""OpenAI request bodies (pydantic, validated in strict mode).

Unknown fields are ignored (as OpenAI and vLLM do); known fields are type and
range checked here (the limits appear in ``/openapi.json``) and again by
``SamplingParams`` — both become HTTP 400 ``invalid_request_error`` answers.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pagedjax.entrypoints.openai.errors import OpenAIError  # noqa: F401 - re-exported
from pagedjax.entrypoints.openai.structured import StructuredFields
from pagedjax.entrypoints.openai.tools import ToolFields


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


# Documented limits of the request fields (enforced by pydantic, shown in /openapi.json).
MAX_N = 256
MAX_TEMPERATURE = 2.0
MAX_LOGPROBS = 20
MAX_STRING_LIST = 256

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Text = Annotated[str, Field(max_length=2**22)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _SamplingFields(StructuredFields):
    """Fields shared by both endpoints (OpenAI's, plus vLLM's extras; the structured-output
    ones, response_format included, come from ``structured.StructuredFields``)."""

    model: Optional[str] = Field(None, max_length=256)
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: Optional[float] = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1, le=2**31 - 1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=-(2**63), le=2**64 - 1)
    stop: Optional[Union[Annotated[str, Field(min_length=1, max_length=1024)],
                         Annotated[list[Annotated[str, Field(min_length=1, max_length=1024)]],
                                   Field(max_length=64)]]] = None
    stop_token_ids: Optional[Annotated[list[TokenId], Field(max_length=64)]] = None
    presence_penalty: Optional[float] = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=100.0)
    logit_bias: Optional[Annotated[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]],
                                   Field(max_length=300)]] = None
    user: Optional[str] = Field(None, max_length=256)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=2**31 - 1)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    bad_words: Optional[Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]],
                                  Field(max_length=64)]] = None
    allowed_token_ids: Optional[Annotated[list[TokenId], Field(min_length=1)]] = None


class CompletionRequest(_SamplingFields):
    prompt: Union[Text, Annotated[list[Text], Field(min_length=1, max_length=MAX_STRING_LIST)],
                  Annotated[list[TokenId], Field(min_length=1)],
                  Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                            Field(min_length=1, max_length=MAX_STRING_LIST)]]
    max_tokens: Optional[int] = Field(16, ge=1, le=2**31 - 1)
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: Optional[int] = Field(None, ge=1, le=MAX_N)
    suffix: Optional[str] = Field(None, max_length=1024)
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)


class ChatMessage(_Base):
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1, max_length=64)
    content: Optional[Union[Text, list[dict[str, Any]]]] = None
    name: Optional[str] = Field(None, max_length=256)


class ChatCompletionRequest(_SamplingFields, ToolFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_tokens: Optional[int] = Field(None, ge=1, le=2**31 - 1)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=2**31 - 1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    chat_template: Optional[str] = Field(None, max_length=65536)
    chat_template_kwargs: Optional[Annotated[dict[str, Any], Field(max_length=64)]] = None


class ModelCard(_Base):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "pagedjax"
    root: Optional[str] = None
    parent: Optional[str] = None  # LoRA adapters: the base model
    max_model_len: Optional[int] = None


class TokenizeRequest(_Base):
    """vLLM's /tokenize body: ``prompt`` (text) or ``messages`` (rendered by the chat
    template, with ``add_generation_prompt`` and an optional ``chat_template``)."""

    model: Optional[str] = Field(None, max_length=256)
    prompt: Optional[Text] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]] = None
    add_special_tokens: Optional[bool] = None  # default: True for prompt, False for messages
    add_generation_prompt: bool = True
    chat_template: Optional[str] = Field(None, max_length=65536)
    tools: Optional[list[dict[str, Any]]] = Field(None, max_length=128)
    return_token_strs: bool = False


class DetokenizeRequest(_Base):
    model: Optional[str] = Field(None, max_length=256)
    tokens: Annotated[list[TokenId], Field(max_length=2**20)]
