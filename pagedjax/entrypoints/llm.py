"""LLM: the offline batch API with vLLM's names (generate, chat, beam_search)."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from pagedjax.config import EngineArgs
from pagedjax.engine import input_checks as checks
from pagedjax.engine.llm_engine import LLMEngine
from pagedjax.outputs import BeamSearchOutput, RequestOutput
from pagedjax.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams


class LLM:
    """An engine plus a tokenizer, for offline batched generation.

    ``LLM()`` loads the default model (SmolLM2-135M-Instruct); ``model`` may
    also be an HF folder or a ``.gguf`` file. Keyword arguments are
    :class:`pagedjax.config.EngineArgs` fields (``max_model_len``,
    ``num_pages``, ``page_size``, ``max_num_seqs``, ``enable_prefix_caching``,
    ``attention_backend``, ``tensor_parallel_size``, ...).
    """

    def __init__(self, model: str | None = None, tokenizer: str | None = None, **kwargs: Any):
        checks.unknown_kwargs("LLM", kwargs, EngineArgs.__dataclass_fields__)
        self.engine_args = EngineArgs(model=model, tokenizer=tokenizer, **kwargs)
        self.llm_engine = LLMEngine(self.engine_args)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (temperature,
        top_p, top_k, min_p, repetition_penalty, max_new_tokens) unless
        ``generation_config="vllm"``; what ``generate`` uses when given none."""
        return SamplingParams(**self.llm_engine.default_sampling)

    # ------------------------------------------------------------------ generate
    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 lora_request=None) -> list[RequestOutput]:
        """Generate completions for one prompt or a list (strings or token-id lists).

        ``lora_request``: a :class:`pagedjax.LoRARequest` for every prompt, or a list
        with one per prompt (None entries: the base model); needs ``enable_lora``.
        Returns one :class:`RequestOutput` per prompt, in prompt order.
        """
        prompts = checks.prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params = [checks.sampling_params(sampling_params)] * len(prompts)
        else:
            params = checks.per_prompt("sampling_params", sampling_params, len(prompts),
                                       checks.sampling_params)
        params = _final_only(params)
        priority = checks.per_prompt("priority", priority, len(prompts), checks.priority)
        if not isinstance(use_tqdm, bool):
            raise checks.ArgumentTypeError(f"use_tqdm must be True or False, got "
                                           f"{checks.short(use_tqdm)}.")
        loras = list(lora_request) if isinstance(lora_request, (list, tuple)) \
            else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"lora_request must be one LoRARequest or a list with one per "
                             f"prompt ({len(prompts)}), got {len(loras)}")
        engine = self.llm_engine
        ids = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                rid = str(next(self._ids))
                engine.add_request(rid, p, sp, priority=priority[i] if priority else 0,
                                   lora_request=loras[i])
                ids.append(rid)
        except Exception:
            engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        from tqdm.auto import tqdm

        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm)
        wanted = set(ids)
        try:
            while len(finished) < len(ids):
                if not engine.has_unfinished_requests():
                    break
                for out in engine.step():
                    if out.finished and out.request_id in wanted:
                        finished[out.request_id] = out
                        bar.update(1)
        except BaseException:
            engine.abort_request(ids)
            raise
        finally:
            bar.close()
        return [finished[i] for i in ids if i in finished]

    # ------------------------------------------------------------------ chat
    def chat(self, messages, sampling_params: SamplingParams | None = None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, chat_template: str | None = None,
             lora_request=None, chat_template_kwargs: dict | None = None,
             tools: list[dict] | None = None, reasoning_parser: str | None = None):
        """Apply the model's chat template to one conversation or a list of them
        (``lora_request`` as in :meth:`generate`). Image parts (``image_url`` with a
        base64 ``data:`` URL, ``image_pil``, ``image``) go to a vision model.

        ``chat_template_kwargs`` are extra template variables (e.g.
        ``{"enable_thinking": False}``); ``tools`` reach the template as OpenAI's
        tool list. ``reasoning_parser`` ('qwen3', 'deepseek_r1') splits each
        output: ``reasoning_content`` holds the thinking and ``text`` the answer,
        and a structured-output constraint applies to the answer only."""
        from pagedjax.engine.mm_chat import chat_images
        from pagedjax.engine.tokenizer import apply_chat_template
        from pagedjax.entrypoints.reasoning.chat import ChatReasoning

        engine = self.llm_engine
        tok = engine.tokenizer
        mm = engine.mm_processor
        placeholder = mm.placeholder_text(tok) if mm is not None else None
        convs = messages if messages and isinstance(messages[0], list) else [messages]
        prompts, splits, params = [], [], []
        for conv in convs:
            conv, images = chat_images(list(conv), placeholder)  # image parts -> placeholders
            ids = apply_chat_template(tok, conv, add_generation_prompt=add_generation_prompt,
                                      chat_template=chat_template, tools=tools,
                                      **(chat_template_kwargs or {}))
            prompts.append({"prompt_token_ids": ids})
            if images:
                prompts[-1]["multi_modal_data"] = {"image": images}
            sp = sampling_params or self.get_default_sampling_params()
            if reasoning_parser is not None:
                split = ChatReasoning(reasoning_parser, tok, ids)
                splits.append(split)
                if sp.structured_outputs is not None:
                    sp = sp.clone()
                    sp.structured_outputs = split.constrain_after(sp.structured_outputs)
            params.append(sp)
        outs = self.generate(prompts, params, use_tqdm=use_tqdm, lora_request=lora_request)
        for out, split in zip(outs, splits):
            for o in out.outputs:
                reasoning, o.text = split.parser().split(o.text)
                o.text = o.text or ""
                o.reasoning_content = reasoning
        return outs

    # ------------------------------------------------------------------ embed
    def embed(self, prompts, pooling: str = "last", normalize: bool = True,
              dimensions: int | None = None, use_tqdm: bool = True, lora_request=None):
        """Embeddings of one prompt or a list (text or token ids): the prompt's final
        hidden states pooled ('last' token or 'mean'), cut to ``dimensions``
        (Matryoshka) and L2-normalised. Returns one ``EmbeddingRequestOutput`` per
        prompt (``.outputs.embedding``); see pagedjax/entrypoints/pooling.py."""
        from pagedjax.entrypoints.pooling import (EmbeddingOutput, EmbeddingRequestOutput,
                                                  check_pooling, pool, pooling_params)

        check_pooling(pooling, dimensions, self.llm_engine.info.hidden_size)
        outs = self.generate(prompts, pooling_params(pooling), use_tqdm=use_tqdm,
                             lora_request=lora_request)
        return [EmbeddingRequestOutput(o.request_id, o.prompt_token_ids, EmbeddingOutput(
            pool(o.prompt_hidden_states, pooling, normalize, dimensions).tolist()))
            for o in outs]

    # ------------------------------------------------------------------ score
    def score(self, text_1, text_2, instruction: str | None = None, use_tqdm: bool = True):
        """Cross-encoder scores of (text_1, text_2) pairs with this decoder as a yes/no
        reranker (Qwen3-Reranker's prompt; see pagedjax/entrypoints/scoring.py). One
        text_1 is scored against every text_2, or two lists pairwise. Returns one
        ``ScoringRequestOutput`` per pair (``.outputs.score`` in [0, 1])."""
        from pagedjax.entrypoints.scoring import (ScoringOutput, ScoringRequestOutput,
                                                  YesNoScorer, pairs_of)

        scorer = YesNoScorer(self.llm_engine.tokenizer)
        ids = [scorer.prompt_ids(q, d, instruction) for q, d in pairs_of(text_1, text_2)]
        outs = self.generate([{"prompt_token_ids": p} for p in ids], scorer.params(),
                             use_tqdm=use_tqdm)
        scores = scorer.scores(outs, self.llm_engine.logits_of)
        return [ScoringRequestOutput(o.request_id, p, ScoringOutput(s))
                for o, p, s in zip(outs, ids, scores)]

    # ------------------------------------------------------------------ beam search
    def beam_search(self, prompts, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """Beam search with forked, page-sharing beams (see pagedjax/entrypoints/beam_search.py)."""
        from pagedjax.entrypoints.beam_search import run_beam_search

        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        return run_beam_search(self.llm_engine, list(prompts), params, self._ids)

    def stats(self) -> dict:
        """Pool and step statistics (pages used/cached/free, prefix hits, steps)."""
        st = self.llm_engine.pool_stats()
        return {"pool": st, "num_steps": self.llm_engine.num_steps,
                "kv_waste": self.llm_engine.scheduler.kv_waste()}


def _final_only(params: list[SamplingParams]) -> list[SamplingParams]:
    """``generate`` returns final outputs only (as vLLM's LLM does): the engine then
    builds no per-step output for these requests. Copies, one per distinct object;
    the caller's parameters are left as they are."""
    copies: dict[int, SamplingParams] = {}
    out = []
    for p in params:
        if p.output_kind != RequestOutputKind.FINAL_ONLY:
            if id(p) not in copies:
                q = copies[id(p)] = p.clone()
                q.output_kind = RequestOutputKind.FINAL_ONLY
            p = copies[id(p)]
        out.append(p)
    return out
