"""``/score`` and ``/rerank`` in vLLM's shapes (also under ``/v1``), on
:mod:`pagedjax.entrypoints.scoring` (a decoder as a yes/no cross-encoder).

* ``/score``: ``{"text_1": str | [str], "text_2": str | [str]}`` ->
  ``{"object": "list", "data": [{"index", "object": "score", "score"}], "usage"}``;
* ``/rerank``: ``{"query", "documents": [str], "top_n"}`` -> ``{"results":
  [{"index", "document": {"text"}, "relevance_score"}], "usage"}``, best first.

Both take an optional ``instruction`` (the reranker prompt's ``<Instruct>``).
"""

from __future__ import annotations

from typing import Annotated, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.jobs import pooled_outputs
from pagedjax.entrypoints.openai.protocol import Text, now, random_id
from pagedjax.entrypoints.scoring import YesNoScorer, pairs_of

MAX_PAIRS = 256
Texts = Union[Text, Annotated[list[Text], Field(min_length=1, max_length=MAX_PAIRS)]]


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ScoreRequest(_Base):
    model: Optional[str] = Field(None, max_length=256)
    text_1: Texts
    text_2: Texts
    instruction: Optional[str] = Field(None, max_length=4096)


class RerankRequest(_Base):
    model: Optional[str] = Field(None, max_length=256)
    query: Text
    documents: Annotated[list[Text], Field(min_length=1, max_length=MAX_PAIRS)]
    top_n: Optional[int] = Field(None, ge=1, le=MAX_PAIRS)
    instruction: Optional[str] = Field(None, max_length=4096)


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ScoreData(_Out):
    index: int
    object: str
    score: float


class ScoreResponse(_Out):
    id: str
    object: str
    model: str
    data: list[ScoreData]


class RerankResult(_Out):
    index: int
    relevance_score: float


class RerankResponse(_Out):
    id: str
    model: str
    results: list[RerankResult]


class ScoreServing:
    def __init__(self, serving):
        self.serving = serving  # OpenAIServing
        self._scorer: Optional[YesNoScorer] = None

    def scorer(self) -> YesNoScorer:
        if self._scorer is None:
            try:
                self._scorer = YesNoScorer(self.serving.tokenizer)
            except ValueError as e:
                raise OpenAIError(f"this model cannot score: {e}", 400, param="model") from e
        return self._scorer

    async def _scores(self, pairs, instruction, raw_request, model) -> tuple[list[float], int]:
        sc = self.scorer()
        llm = self.serving.llm
        ids = [await llm.run_in_worker(sc.prompt_ids, q, d, instruction) for q, d in pairs]
        for p in ids:
            self.serving.check_prompt_length(len(p))
        prompts = [{"prompt_token_ids": p} for p in ids]
        outs = await pooled_outputs(llm, random_id("score"), raw_request, prompts, sc.params(),
                                    self.serving.lora_of(model))
        scores = await llm.run_in_worker(sc.scores, outs, llm.engine.logits_of)
        return scores, sum(len(p) for p in ids)

    async def score(self, req: ScoreRequest, raw_request) -> dict:
        model = self.serving.check_model(req.model)
        try:
            pairs = pairs_of(req.text_1, req.text_2)
        except ValueError as e:
            raise OpenAIError(str(e), 400, param="text_2") from e
        if len(pairs) > MAX_PAIRS:
            raise OpenAIError(f"at most {MAX_PAIRS} pairs per request.", 400, param="text_2")
        scores, n = await self._scores(pairs, req.instruction, raw_request, model)
        return {"id": random_id("score"), "object": "list", "created": now(), "model": model,
                "data": [{"index": i, "object": "score", "score": s}
                         for i, s in enumerate(scores)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    async def rerank(self, req: RerankRequest, raw_request) -> dict:
        model = self.serving.check_model(req.model)
        pairs = [(req.query, d) for d in req.documents]
        scores, n = await self._scores(pairs, req.instruction, raw_request, model)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n]
        return {"id": random_id("rerank"), "model": model, "usage": {"total_tokens": n},
                "results": [{"index": i, "document": {"text": req.documents[i]},
                             "relevance_score": scores[i]} for i in order]}
