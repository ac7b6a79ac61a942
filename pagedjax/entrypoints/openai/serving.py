"""OpenAI completions and chat completions on :class:`pagedjax.AsyncLLM`.

The event loop only routes: prompts are tokenized and chat templates rendered
in AsyncLLM's worker pool (a client's own template under a time limit), text
is detokenized on the engine thread, and streams use ``RequestOutputKind.DELTA``
so each chunk is what the engine produced since the last one.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Optional

from pagedjax.engine.async_llm import AsyncLLM
from pagedjax.entrypoints.openai import formatting as fmt
from pagedjax.entrypoints.openai.chat_render import DEFAULT_TIME_LIMIT_S, render_chat_ids
from pagedjax.entrypoints.openai.media import MediaFetcher, image_parts
from pagedjax.entrypoints.openai.chat_tools import ChoiceTools
from pagedjax.entrypoints.openai.errors import OpenAIError, param_of, short
from pagedjax.entrypoints.openai.jobs import Job
from pagedjax.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, now,
                                                  random_id)
from pagedjax.entrypoints.openai.structured import (check_structured_outputs,
                                                    structured_outputs_of)
from pagedjax.entrypoints.openai.tools import (ToolPlan, messages_for_template, plan_tools,
                                               tool_constraint)
from pagedjax.entrypoints.reasoning.chat import ChatReasoning, ChoiceReasoning
from pagedjax.sampling_params import RequestOutputKind, SamplingParams

MAX_CHOICES = 256


def logit_bias_ids(bias: dict) -> dict:
    """OpenAI's ``logit_bias`` ({"<token id>": bias}) with integer keys (400 otherwise)."""
    out = {}
    for k, v in bias.items():
        if not (k.isascii() and k.isdigit()):
            raise OpenAIError(f"logit_bias keys must be token ids written as decimal integers "
                              f"(e.g. \"50256\"), got {short(k)}.", 400, param="logit_bias")
        out[int(k)] = float(v)
    return out


class OpenAIServing:
    def __init__(self, llm: AsyncLLM, served_model_names: list[str], max_logprobs: int = 20,
                 template_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 tool_call_parser: Optional[str] = None, reasoning_parser: Optional[str] = None):
        self.llm = llm
        self.tool_call_parser = tool_call_parser  # set: tool_choice "auto" is answered
        self.reasoning_parser = reasoning_parser  # set: thinking goes to reasoning_content
        engine = llm.engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.info.vocab_size
        # The model's generation_config.json values for fields a request leaves unset.
        self.defaults = dict(getattr(engine, "default_sampling", {}))
        self.served_model_names = served_model_names
        self.max_logprobs = max_logprobs
        self.template_time_limit_s = template_time_limit_s
        self.loras = None  # lora_routes.LoRARegistry: adapter names served as models
        # Images (vision-language models): image_url parts, fetched under the media limits.
        self.mm_processor = getattr(engine, "mm_processor", None)
        self.image_placeholder = (None if self.mm_processor is None else
                                  self.mm_processor.placeholder_text(self.tokenizer))
        self.media = MediaFetcher.from_args(getattr(engine, "args", None))

    # ------------------------------------------------------------------ helpers
    def check_model(self, model: Optional[str]) -> str:
        if model is None or model in self.served_model_names:
            return self.served_model_names[0]
        if self.loras is not None and self.loras.get(model) is not None:
            return model
        raise OpenAIError(f"The model {short(model)} does not exist.", 404, param="model",
                          code="model_not_found")

    def _lora(self, model: str):
        """The LoRARequest of an adapter served under ``model``, else None (the base)."""
        return self.loras.get(model) if self.loras is not None else None

    lora_of = _lora  # the public name, for the other endpoints

    def check_prompt_length(self, n_prompt: int, what: str = "prompt") -> None:
        """OpenAIError 400 when a prompt leaves no room for one output token."""
        self._check_length(n_prompt, 1, what)

    def _decode(self, tid: int) -> str:
        return self.tokenizer.decode([int(tid)])

    async def _tokenize(self, prompt: Any) -> dict:
        try:
            text, ids = await self.llm.tokenize(prompt)
        except (ValueError, TypeError, UnicodeError) as e:
            raise OpenAIError(f"the prompt cannot be tokenized: {e}", 400, param="prompt") from e
        if not ids:
            raise OpenAIError("the prompt is empty; give at least one token", 400, param="prompt")
        return {"prompt": text, "prompt_token_ids": ids}

    def _check_length(self, n_prompt: int, max_tokens: Optional[int], what: str) -> int:
        limit = self.max_model_len
        if n_prompt >= limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {n_prompt} input tokens. Please reduce the length of the {what}.", 400,
                param=what)
        if max_tokens is None:  # the room left, or the model's max_new_tokens if smaller
            return min(limit - n_prompt, self.defaults.get("max_tokens", limit))
        if n_prompt + max_tokens > limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the {what}, {max_tokens} in the "
                f"completion). Please reduce the length of the {what} or completion.", 400,
                param="max_tokens")
        return max_tokens

    def _params(self, req, max_tokens: int, logprobs: Optional[int],
                prompt_logprobs: Optional[int] = None, aliases: Optional[dict] = None,
                structured=None) -> SamplingParams:
        aliases = aliases or {}
        if req.stream_options is not None and not req.stream:
            raise OpenAIError("stream_options is only allowed when stream is true.", 400,
                              param="stream_options")
        for name, v in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if v is not None and v > self.max_logprobs:
                raise OpenAIError(f"{aliases.get(name, name)} must be <= {self.max_logprobs}, "
                                  f"got {v}.", 400, param=aliases.get(name, name))
        d = self.defaults
        kw = dict(
            n=req.n, temperature=d.get("temperature", 1.0) if req.temperature is None
            else req.temperature,
            top_p=d.get("top_p", 1.0) if req.top_p is None else req.top_p,
            top_k=d.get("top_k", 0) if req.top_k is None else req.top_k,
            min_p=d.get("min_p", 0.0) if req.min_p is None else req.min_p, seed=req.seed,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=d.get("repetition_penalty", 1.0) if req.repetition_penalty is None
            else req.repetition_penalty,
            max_tokens=max_tokens, min_tokens=req.min_tokens, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            bad_words=req.bad_words, allowed_token_ids=req.allowed_token_ids,
            output_kind=RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
            structured_outputs=structured or structured_outputs_of(req)[0])
        try:
            if req.logit_bias is not None:
                kw["logit_bias"] = logit_bias_ids(req.logit_bias)
            sp = SamplingParams(**kw)
            sp.verify_vocab(self.vocab_size)
        except ValueError as e:
            raise OpenAIError(str(e), 400, param=param_of(str(e), aliases)) from e
        return sp

    @staticmethod
    def _stream_flags(req) -> tuple[bool, bool]:
        so = req.stream_options
        return bool(so and so.include_usage), bool(so and so.continuous_usage_stats)

    # ------------------------------------------------------------------ completions
    async def completions(self, req: CompletionRequest, raw_request):
        model = self.check_model(req.model)
        if req.suffix is not None:
            raise OpenAIError("suffix is not supported.", 400, param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise OpenAIError("best_of is not supported (only best_of == n).", 400,
                              param="best_of")
        if req.echo and req.stream and req.logprobs is not None:
            raise OpenAIError("echo with logprobs is not supported when streaming.", 400,
                              param="echo")
        p = req.prompt
        if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)):
            prompts = [p]
        else:
            prompts = list(p)
        if not prompts:
            raise OpenAIError("prompt must not be empty.", 400, param="prompt")
        if len(prompts) * req.n > MAX_CHOICES:
            raise OpenAIError(f"at most {MAX_CHOICES} completions (prompts x n) per request.",
                              400, param="n")
        toks = [await self._tokenize(x) for x in prompts]
        max_tokens = min(self._check_length(len(t["prompt_token_ids"]), req.max_tokens, "prompt")
                         for t in toks)
        plp = req.logprobs if (req.echo and req.logprobs is not None) else req.prompt_logprobs
        params = self._params(req, max_tokens, req.logprobs, plp)
        await check_structured_outputs(self.llm, params, structured_outputs_of(req)[1])
        job = Job(self.llm, random_id("cmpl"), raw_request)
        await job.start(toks, params, watch_disconnect=not req.stream,
                        lora_request=self._lora(model))
        meta = dict(id=job.base_id, created=now(), model=model)
        if req.stream:
            return self._completion_stream(job, req, toks, meta)
        finals = await job.final_outputs()
        return self._completion_body(req, toks, finals, meta)

    def _completion_body(self, req, toks, finals, meta) -> dict:
        choices, n_out = [], 0
        for i in range(len(toks)):
            out = finals[i]
            prompt_text = out.prompt if out.prompt is not None else \
                self.tokenizer.decode(out.prompt_token_ids)
            for o in out.outputs:
                if (err := fmt.generation_error(o)) is not None:
                    raise err
                n_out += len(o.token_ids)
                text = (prompt_text + o.text) if req.echo else o.text
                logprobs = None
                if req.logprobs is not None:
                    ids, lps = o.token_ids, o.logprobs or []
                    if req.echo:
                        plps = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
                        ids, lps = list(out.prompt_token_ids) + list(ids), list(plps) + list(lps)
                    logprobs = fmt.legacy_logprobs(ids, lps, 0, req.logprobs, self._decode)
                finish, stop_reason = fmt.openai_finish(o)
                choices.append({"index": i * req.n + o.index, "text": text, "logprobs": logprobs,
                                "finish_reason": finish, "stop_reason": stop_reason})
        u = fmt.usage([len(t["prompt_token_ids"]) for t in toks], n_out)
        return {**meta, "object": "text_completion", "choices": choices, "usage": u}

    async def _completion_stream(self, job: Job, req, toks, meta) -> AsyncIterator[str]:
        n = req.n
        sent_chars: dict[int, int] = {}
        n_tokens: dict[int, int] = {}
        include_usage, continuous = self._stream_flags(req)
        plens = [len(t["prompt_token_ids"]) for t in toks]
        base = {**meta, "object": "text_completion"}
        try:
            if req.echo:
                for i, t in enumerate(toks):
                    ptext = t["prompt"] if t["prompt"] is not None else \
                        self.tokenizer.decode(t["prompt_token_ids"])
                    for j in range(n):
                        yield fmt.sse({**base, "choices": [
                            {"index": i * n + j, "text": ptext, "logprobs": None,
                             "finish_reason": None, "stop_reason": None}]})
            try:
                async for i, out in job.outputs():
                    for o in out.outputs:
                        idx = i * n + o.index
                        logprobs = None
                        if req.logprobs is not None:
                            logprobs = fmt.legacy_logprobs(o.token_ids, o.logprobs or [],
                                                           sent_chars.get(idx, 0), req.logprobs,
                                                           self._decode)
                        sent_chars[idx] = sent_chars.get(idx, 0) + len(o.text)
                        n_tokens[idx] = n_tokens.get(idx, 0) + len(o.token_ids)
                        finish, stop_reason = fmt.openai_finish(o)
                        chunk = {**base, "choices": [
                            {"index": idx, "text": o.text, "logprobs": logprobs,
                             "finish_reason": finish, "stop_reason": stop_reason}]}
                        if continuous:
                            chunk["usage"] = fmt.usage([plens[i]], n_tokens[idx])
                        yield fmt.sse(chunk)
                        if (err := fmt.generation_error(o)) is not None:
                            raise err
            except OpenAIError as e:
                yield fmt.sse(e.body())
            else:
                if include_usage:
                    yield fmt.sse({**base, "choices": [],
                                   "usage": fmt.usage(plens, sum(n_tokens.values()))})
            yield fmt.SSE_DONE
        finally:
            job.close()

    # ------------------------------------------------------------------ chat
    @staticmethod
    def messages(chat_messages) -> list[dict]:
        """A request's ``messages`` as the chat template takes them (text parts joined)."""
        messages = []
        for m in chat_messages:
            d = m.model_dump(exclude_none=True)
            c = d.get("content")
            if isinstance(c, list):
                parts = []
                for part in c:
                    if part.get("type") not in (None, "text"):
                        raise OpenAIError(f"content parts of type {short(part.get('type'))} are "
                                          "not supported (text only).", 400, param="messages")
                    parts.append(str(part.get("text", "")))
                d["content"] = "".join(parts)
            elif c is None:
                d["content"] = ""
            messages.append(d)
        return messages_for_template(messages)

    async def render_chat(self, req, tools=None, add_special_tokens: bool = False) -> list[int]:
        """Token ids of a request's messages rendered by its (or the model's) chat
        template, in the worker pool; OpenAIError 400 if the template fails."""
        messages = self.messages(req.messages)
        try:
            return await self.llm.run_in_worker(
                render_chat_ids, self.tokenizer, messages, req.add_generation_prompt,
                req.chat_template, self.template_time_limit_s, tools, add_special_tokens,
                getattr(req, "chat_template_kwargs", None))
        except ValueError as e:
            param = "chat_template" if req.chat_template is not None else "messages"
            if "chat_template_kwargs" in str(e):
                param = "chat_template_kwargs"
            raise OpenAIError(str(e), 400, param=param) from e

    async def _render_chat(self, req: ChatCompletionRequest, tools) -> dict:
        ids = await self.render_chat(req, tools)
        if not ids:
            raise OpenAIError("the rendered chat prompt is empty.", 400, param="messages")
        return {"prompt_token_ids": ids}

    async def chat(self, req: ChatCompletionRequest, raw_request):
        model = self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError("top_logprobs requires logprobs to be true.", 400,
                              param="top_logprobs")
        if req.n > MAX_CHOICES:
            raise OpenAIError(f"n must be <= {MAX_CHOICES}.", 400, param="n")
        plan = plan_tools(req, self.tool_call_parser is not None)
        messages, urls = image_parts(req.messages, self.image_placeholder)
        if urls:
            req = req.model_copy(update={"messages": messages})
        prompt = await self._render_chat(req, plan.tools)
        if urls:
            prompt["multi_modal_data"] = {"image": await self._fetch_images(urls)}
        plen = len(prompt["prompt_token_ids"])
        mt = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = self._check_length(plen, mt, "messages")
        k = (req.top_logprobs or 0) if req.logprobs else None
        constraint, field = self._tool_constraint(req, plan)
        reasoning = ChatReasoning(self.reasoning_parser, self.tokenizer,
                                  prompt["prompt_token_ids"]) if self.reasoning_parser else None
        if reasoning is not None:  # the constraint starts after the thinking
            constraint = reasoning.constrain_after(constraint or structured_outputs_of(req)[0])
        params = self._params(req, max_tokens, k, aliases={"logprobs": "top_logprobs"},
                              structured=constraint)
        await check_structured_outputs(self.llm, params, field)
        job = Job(self.llm, random_id("chatcmpl"), raw_request)
        await job.start([prompt], params, watch_disconnect=not req.stream,
                        lora_request=self._lora(model))
        meta = dict(id=job.base_id, created=now(), model=model)
        if req.stream:
            return self._chat_stream(job, req, plen, meta, k, plan, reasoning)
        final = (await job.final_outputs())[0]
        choices = []
        for o in final.outputs:
            if (err := fmt.generation_error(o)) is not None:
                raise err
            lp = (fmt.chat_logprobs(o.token_ids, o.logprobs or [], k, self._decode)
                  if k is not None else None)
            tools = ChoiceTools(plan, self.tool_call_parser)
            thought, text = ChoiceReasoning(reasoning).split(o.text)
            message = tools.message(text)
            if reasoning is not None:
                message["reasoning_content"] = thought
            choices.append({"index": o.index, "message": message,
                            "logprobs": lp, "finish_reason": tools.finish_reason(o.finish_reason),
                            "stop_reason": o.stop_reason})
        n_out = sum(len(o.token_ids) for o in final.outputs)
        plen = fmt.prompt_len(final, plen)  # image placeholders count, as in vLLM
        return {**meta, "object": "chat.completion", "choices": choices,
                "usage": fmt.usage([plen], n_out)}

    async def _fetch_images(self, urls: list[str]) -> list[bytes]:
        """The images of ``image_url`` parts (their count checked before any fetch)."""
        try:
            self.mm_processor.check_count(len(urls))
        except ValueError as e:
            raise OpenAIError(str(e), 400, param="messages") from e
        return [await self.media.fetch(u) for u in urls]

    @staticmethod
    def _tool_constraint(req, plan: ToolPlan):
        """(the constraint of a required / named tool choice or None, the field to blame
        if it does not compile)."""
        if not plan.constrained:
            return None, structured_outputs_of(req)[1]
        if structured_outputs_of(req)[0] is not None:
            raise OpenAIError(f"tool_choice {plan.mode!r} constrains the output itself; it "
                              "cannot be combined with response_format or structured_outputs.",
                              400, param="tool_choice")
        return tool_constraint(req, plan), "tools"

    async def _chat_stream(self, job: Job, req, plen: int, meta, k,
                           plan: ToolPlan, reasoning=None) -> AsyncIterator[str]:
        n_tokens: dict[int, int] = {}
        tools = {j: ChoiceTools(plan, self.tool_call_parser) for j in range(req.n)}
        thoughts = {j: ChoiceReasoning(reasoning) for j in range(req.n)}
        include_usage, continuous = self._stream_flags(req)
        base = {**meta, "object": "chat.completion.chunk"}
        try:
            for j in range(req.n):
                yield fmt.sse({**base, "choices": [{"index": j, "delta": {"role": "assistant",
                                                                           "content": ""},
                                                    "logprobs": None, "finish_reason": None}]})
            try:
                async for _, out in job.outputs():
                    plen = fmt.prompt_len(out, plen)  # image placeholders count, as in vLLM
                    for o in out.outputs:
                        n_tokens[o.index] = n_tokens.get(o.index, 0) + len(o.token_ids)
                        lp = (fmt.chat_logprobs(o.token_ids, o.logprobs or [], k, self._decode)
                              if k is not None else None)
                        t, final = tools[o.index], o.finish_reason is not None
                        thought, text = thoughts[o.index].delta(o.text, final)
                        delta = t.delta(text, final=final)
                        if thought:
                            delta = {"reasoning_content": thought, **delta}
                        reason, stop_reason = fmt.openai_finish(o)
                        finish = t.finish_reason(reason)
                        held = t.active or reasoning is not None
                        if held and not delta and finish is None and lp is None \
                                and not continuous:
                            continue  # text held back by the tool parser
                        chunk = {**base, "choices": [{"index": o.index, "delta": delta,
                                                      "logprobs": lp, "finish_reason": finish,
                                                      "stop_reason": stop_reason}]}
                        if continuous:
                            chunk["usage"] = fmt.usage([plen], n_tokens[o.index])
                        yield fmt.sse(chunk)
                        if (err := fmt.generation_error(o)) is not None:
                            raise err
            except OpenAIError as e:
                yield fmt.sse(e.body())
            else:
                if include_usage:
                    yield fmt.sse({**base, "choices": [],
                                   "usage": fmt.usage([plen], sum(n_tokens.values()))})
            yield fmt.SSE_DONE
        finally:
            job.close()
