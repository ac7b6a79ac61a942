"""``POST /v1/embeddings`` in OpenAI's shape, on :mod:`pagedjax.entrypoints.pooling`.

``input``: a text, a list of texts, a list of token ids or a list of such lists;
``encoding_format``: ``float`` (lists of numbers) or ``base64`` (little-endian
float32 bytes, as the ``openai`` client decodes them); ``dimensions``: the
first ``d`` components (Matryoshka), normalised again. The pooling (last token
or mean) is the server's ``--pooling-type``. Each input is one engine request
(prefill only, in the continuous batch with generation).
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.jobs import pooled_outputs
from pagedjax.entrypoints.openai.protocol import MAX_STRING_LIST, Text, TokenId, random_id
from pagedjax.entrypoints.pooling import check_pooling, pool, pooling_params


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = Field(None, max_length=256)
    input: Union[Text, Annotated[list[Text], Field(min_length=1, max_length=MAX_STRING_LIST)],
                 Annotated[list[TokenId], Field(min_length=1)],
                 Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                           Field(min_length=1, max_length=MAX_STRING_LIST)]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1, le=2**20)
    user: Optional[str] = Field(None, max_length=256)


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class EmbeddingData(_Out):
    object: Literal["embedding"]
    index: int
    embedding: Union[list[float], str]


class EmbeddingResponse(_Out):
    object: Literal["list"]
    model: str
    data: list[EmbeddingData]


class EmbeddingServing:
    def __init__(self, serving, pooling: str = "last"):
        self.serving = serving  # OpenAIServing
        self.pooling = pooling
        check_pooling(pooling, None, 1)

    async def create(self, req: EmbeddingRequest, raw_request) -> dict:
        s = self.serving
        model = s.check_model(req.model)
        hidden = s.llm.engine.info.hidden_size
        if req.dimensions is not None and req.dimensions > hidden:
            raise OpenAIError(f"dimensions must be <= {hidden} (the model's hidden size), got "
                              f"{req.dimensions}.", 400, param="dimensions")
        inp = req.input
        many = isinstance(inp, list) and inp and not isinstance(inp[0], int)
        items = list(inp) if many else [inp]
        prompts = []
        for x in items:
            try:
                _, ids = await s.llm.tokenize(x)
            except (ValueError, TypeError, UnicodeError) as e:
                raise OpenAIError(f"the input cannot be tokenized: {e}", 400,
                                  param="input") from e
            if not ids:
                raise OpenAIError("an input is empty; give at least one token.", 400,
                                  param="input")
            s.check_prompt_length(len(ids), "input")
            prompts.append({"prompt_token_ids": ids})
        finals = await pooled_outputs(s.llm, random_id("embd"), raw_request, prompts,
                                      pooling_params(self.pooling), s.lora_of(model))
        data = []
        for i in range(len(prompts)):
            v = pool(finals[i].prompt_hidden_states, self.pooling, True, req.dimensions)
            emb = base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() \
                if req.encoding_format == "base64" else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = sum(len(p["prompt_token_ids"]) for p in prompts)
        return {"object": "list", "model": model, "data": data,
                "usage": {"prompt_tokens": n, "total_tokens": n}}
