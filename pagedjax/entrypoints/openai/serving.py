"""OpenAI completions and chat completions on top of :class:`AsyncEngine`.

Engine outputs are cumulative (full text and token ids so far); streaming
sends the difference from what this HTTP request already sent, per choice.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, AsyncIterator, Optional

from pagedjax.entrypoints.openai.engine_loop import AsyncEngine, EngineError
from pagedjax.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                  OpenAIError, now, random_id)
from pagedjax.sampling_params import SamplingParams

_DISCONNECTED = object()


class ClientDisconnected(Exception):
    """The HTTP client went away; its engine requests have been aborted."""
_FIELD_RE = re.compile(r"^([a-z_]+) ")


def _param_of(message: str) -> Optional[str]:
    m = _FIELD_RE.match(message)
    return m.group(1) if m else None


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _Job:
    """One HTTP request: its engine requests, its queue and its disconnect watcher."""

    def __init__(self, aengine: AsyncEngine, base_id: str, raw_request):
        self.aengine = aengine
        self.base_id = base_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self.rids: list[str] = []
        self.done: set[str] = set()
        self._watch: Optional[asyncio.Task] = None
        self._raw = raw_request

    async def start(self, prompts: list[dict], params: SamplingParams) -> None:
        try:
            for i, p in enumerate(prompts):
                rid = f"{self.base_id}.{i}"
                await self.aengine.add(rid, p, params, self.queue, tag=i)
                self.rids.append(rid)
        except ValueError as e:
            self.abort()
            raise OpenAIError(str(e), 400, param=_param_of(str(e))) from e
        except EngineError as e:
            self.abort()
            raise OpenAIError(str(e), 500, type="server_error") from e
        if self._raw is not None and hasattr(self._raw, "receive"):
            self._watch = asyncio.create_task(self._watch_disconnect())

    async def _watch_disconnect(self) -> None:
        try:
            while True:
                msg = await self._raw.receive()
                if msg.get("type") == "http.disconnect":
                    self.queue.put_nowait((None, _DISCONNECTED))
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - receive channel gone: treat as a disconnect
            self.queue.put_nowait((None, _DISCONNECTED))

    async def next(self):
        """(prompt index, RequestOutput); raises on disconnect or engine failure."""
        tag, item = await self.queue.get()
        if item is _DISCONNECTED:
            self.abort()
            raise ClientDisconnected()
        if isinstance(item, BaseException):
            raise OpenAIError(str(item), 500, type="server_error")
        if item.finished:
            self.done.add(self.rids[tag])
        return tag, item

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.rids)

    def abort(self) -> None:
        left = [r for r in self.rids if r not in self.done]
        if left:
            self.aengine.abort(left)
            self.done.update(left)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.abort()


class OpenAIServing:
    def __init__(self, aengine: AsyncEngine, served_model_names: list[str],
                 max_logprobs: int = 20):
        self.aengine = aengine
        self.engine = aengine.engine
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.vocab_size = self.engine.info.vocab_size
        self.served_model_names = served_model_names
        self.max_logprobs = max_logprobs

    # ------------------------------------------------------------------ helpers
    def check_model(self, model: Optional[str]) -> str:
        if model is None or model in self.served_model_names:
            return self.served_model_names[0]
        raise OpenAIError(f"The model `{model}` does not exist.", 404, param="model",
                          code="model_not_found")

    def _decode(self, tid: int) -> str:
        return self.tokenizer.decode([int(tid)])

    def _tokenize(self, prompt: Any) -> dict:
        try:
            text, ids = self.engine.tokenize(prompt)
        except ValueError as e:
            raise OpenAIError(str(e), 400, param="prompt") from e
        if not ids:
            raise OpenAIError("the prompt is empty; give at least one token", 400, param="prompt")
        return {"prompt": text, "prompt_token_ids": ids}

    def _check_length(self, n_prompt: int, max_tokens: Optional[int], what: str) -> int:
        limit = self.max_model_len
        if max_tokens is not None and max_tokens < 1:
            raise OpenAIError(f"max_tokens must be at least 1, got {max_tokens}.", 400,
                              param="max_tokens")
        if n_prompt >= limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {n_prompt} input tokens. Please reduce the length of the {what}.", 400,
                param=what)
        if max_tokens is None:
            return limit - n_prompt
        if n_prompt + max_tokens > limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the {what}, {max_tokens} in the "
                f"completion). Please reduce the length of the {what} or completion.", 400,
                param="max_tokens")
        return max_tokens

    def _params(self, req, max_tokens: int, logprobs: Optional[int],
                prompt_logprobs: Optional[int] = None) -> SamplingParams:
        if req.stream_options is not None and not req.stream:
            raise OpenAIError("stream_options is only allowed when stream is true.", 400,
                              param="stream_options")
        for name, v in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if v is not None and v > self.max_logprobs:
                raise OpenAIError(f"{name} must be <= {self.max_logprobs}, got {v}.", 400,
                                  param=name)
        kw = dict(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k,
            min_p=0.0 if req.min_p is None else req.min_p, seed=req.seed, stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            max_tokens=max_tokens, min_tokens=req.min_tokens, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            bad_words=req.bad_words, allowed_token_ids=req.allowed_token_ids)
        try:
            if req.logit_bias is not None:
                try:
                    kw["logit_bias"] = {int(k): float(v) for k, v in req.logit_bias.items()}
                except ValueError as e:
                    raise ValueError(f"logit_bias keys must be token ids (integers as strings), "
                                     f"got {list(req.logit_bias)[:3]}") from e
            sp = SamplingParams(**kw)
            sp.verify_vocab(self.vocab_size)
        except ValueError as e:
            raise OpenAIError(str(e), 400, param=_param_of(str(e))) from e
        return sp

    @staticmethod
    def _usage(prompt_lens: list[int], outs: list) -> dict:
        p = sum(prompt_lens)
        c = sum(len(o.token_ids) for o in outs)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    # ------------------------------------------------------------------ logprobs
    def _legacy_logprobs(self, token_ids, lps, offset: int, k: int) -> dict:
        tokens, token_lps, tops, offsets = [], [], [], []
        for tid, d in zip(token_ids, lps):
            lp = d.get(tid) if d is not None else None
            tok = (lp.decoded_token if lp is not None and lp.decoded_token is not None
                   else self._decode(tid))
            tokens.append(tok)
            offsets.append(offset)
            offset += len(tok)
            if d is None:
                token_lps.append(None)
                tops.append(None)
                continue
            token_lps.append(max(lp.logprob, -9999.0) if lp is not None else None)
            top = {}
            for t, e in sorted(d.items(), key=lambda kv: kv[1].rank or 0):
                if t == tid or (e.rank is not None and e.rank <= k):
                    s = e.decoded_token if e.decoded_token is not None else self._decode(t)
                    top.setdefault(s, max(e.logprob, -9999.0))
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
                "text_offset": offsets}

    def _chat_logprobs(self, token_ids, lps, k: int) -> dict:
        content = []
        for tid, d in zip(token_ids, lps):
            lp = d.get(tid)
            tok = lp.decoded_token if lp and lp.decoded_token is not None else self._decode(tid)
            top = []
            for t, e in sorted(d.items(), key=lambda kv: kv[1].rank or 0):
                if e.rank is not None and e.rank <= k:
                    s = e.decoded_token if e.decoded_token is not None else self._decode(t)
                    top.append({"token": s, "logprob": max(e.logprob, -9999.0),
                                "bytes": list(s.encode("utf-8"))})
            content.append({"token": tok, "logprob": max(lp.logprob, -9999.0) if lp else None,
                            "bytes": list(tok.encode("utf-8")), "top_logprobs": top[:k]})
        return {"content": content}

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
        if isinstance(p, str):
            prompts = [p]
        elif isinstance(p, list) and p and all(isinstance(x, int) for x in p):
            prompts = [list(p)]
        else:
            prompts = list(p)
        if not prompts:
            raise OpenAIError("prompt must not be empty.", 400, param="prompt")
        if len(prompts) * req.n > 256:
            raise OpenAIError("at most 256 completions (prompts x n) per request.", 400,
                              param="n")
        toks = [self._tokenize(x) for x in prompts]
        max_tokens = min(self._check_length(len(t["prompt_token_ids"]), req.max_tokens, "prompt")
                         for t in toks)
        if req.max_tokens is None:
            max_tokens = min(self.max_model_len - len(t["prompt_token_ids"]) for t in toks)
        plp = req.logprobs if (req.echo and req.logprobs is not None) else req.prompt_logprobs
        params = self._params(req, max_tokens, req.logprobs, plp)
        job = _Job(self.aengine, random_id("cmpl"), raw_request)
        await job.start(toks, params)
        meta = dict(id=job.base_id, created=now(), model=model)
        if req.stream:
            return self._completion_stream(job, req, toks, meta)
        try:
            finals: dict[int, Any] = {}
            while not job.finished:
                i, out = await job.next()
                if out.finished:
                    finals[i] = out
        finally:
            job.close()
        choices, all_outs = [], []
        for i in range(len(toks)):
            out = finals[i]
            prompt_text = out.prompt if out.prompt is not None else \
                self.tokenizer.decode(out.prompt_token_ids)
            for o in out.outputs:
                all_outs.append(o)
                text = (prompt_text + o.text) if req.echo else o.text
                logprobs = None
                if req.logprobs is not None:
                    if req.echo:
                        plps = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
                        ids = list(out.prompt_token_ids) + list(o.token_ids)
                        lps = list(plps) + list(o.logprobs or [])
                    else:
                        ids, lps = o.token_ids, o.logprobs or []
                    logprobs = self._legacy_logprobs(ids, lps, 0, req.logprobs)
                choices.append({"index": i * req.n + o.index, "text": text, "logprobs": logprobs,
                                "finish_reason": o.finish_reason, "stop_reason": o.stop_reason})
        usage = self._usage([len(t["prompt_token_ids"]) for t in toks], all_outs)
        return {**meta, "object": "text_completion", "choices": choices, "usage": usage}

    async def _completion_stream(self, job: _Job, req, toks, meta) -> AsyncIterator[str]:
        n = req.n
        sent_text: dict[int, int] = {}
        sent_tok: dict[int, int] = {}
        finished: set[int] = set()
        last: dict[int, Any] = {}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        plens = [len(t["prompt_token_ids"]) for t in toks]
        try:
            if req.echo:
                for i, t in enumerate(toks):
                    ptext = t["prompt"] if t["prompt"] is not None else \
                        self.tokenizer.decode(t["prompt_token_ids"])
                    for j in range(n):
                        yield _sse({**meta, "object": "text_completion", "choices": [
                            {"index": i * n + j, "text": ptext, "logprobs": None,
                             "finish_reason": None, "stop_reason": None}]})
            while not job.finished:
                try:
                    i, out = await job.next()
                except OpenAIError as e:
                    yield _sse(e.body())
                    break
                except ClientDisconnected:
                    return
                for o in out.outputs:
                    idx = i * n + o.index
                    if idx in finished:
                        continue
                    st, tk = sent_text.get(idx, 0), sent_tok.get(idx, 0)
                    delta = o.text[st:]
                    new_ids = o.token_ids[tk:]
                    if not delta and not new_ids and o.finish_reason is None:
                        continue
                    logprobs = None
                    if req.logprobs is not None:
                        logprobs = self._legacy_logprobs(new_ids, (o.logprobs or [])[tk:],
                                                         st, req.logprobs)
                    sent_text[idx], sent_tok[idx] = len(o.text), len(o.token_ids)
                    chunk = {**meta, "object": "text_completion", "choices": [
                        {"index": idx, "text": delta, "logprobs": logprobs,
                         "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}]}
                    if o.finish_reason is not None:
                        finished.add(idx)
                    if continuous:
                        chunk["usage"] = {"prompt_tokens": plens[i],
                                          "completion_tokens": len(o.token_ids),
                                          "total_tokens": plens[i] + len(o.token_ids)}
                    yield _sse(chunk)
                last[i] = out
            else:
                if include_usage:
                    outs = [o for out in last.values() for o in out.outputs]
                    yield _sse({**meta, "object": "text_completion", "choices": [],
                                "usage": self._usage(plens, outs)})
            yield "data: [DONE]\n\n"
        finally:
            job.close()

    # ------------------------------------------------------------------ chat
    def _render_chat(self, req: ChatCompletionRequest) -> dict:
        from pagedjax.tokenizer import apply_chat_template

        messages = []
        for m in req.messages:
            d = m.model_dump(exclude_none=True)
            c = d.get("content")
            if isinstance(c, list):
                parts = []
                for part in c:
                    if part.get("type") not in (None, "text"):
                        raise OpenAIError(f"content parts of type {part.get('type')!r} are not "
                                          "supported (text only).", 400, param="messages")
                    parts.append(str(part.get("text", "")))
                d["content"] = "".join(parts)
            elif c is None:
                d["content"] = ""
            messages.append(d)
        try:
            ids = apply_chat_template(self.tokenizer, messages,
                                      add_generation_prompt=req.add_generation_prompt,
                                      chat_template=req.chat_template)
        except OpenAIError:
            raise
        except Exception as e:  # noqa: BLE001 - jinja errors, missing template
            raise OpenAIError(f"could not apply the chat template: {e}", 400,
                              param="messages") from e
        if not ids:
            raise OpenAIError("the rendered chat prompt is empty.", 400, param="messages")
        return {"prompt_token_ids": list(ids)}

    async def chat(self, req: ChatCompletionRequest, raw_request):
        model = self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError("top_logprobs requires logprobs to be true.", 400,
                              param="top_logprobs")
        if req.tools:
            raise OpenAIError("tools are not supported.", 400, param="tools")
        if req.response_format and req.response_format.get("type") not in (None, "text"):
            raise OpenAIError("only response_format type 'text' is supported.", 400,
                              param="response_format")
        if req.n > 256:
            raise OpenAIError("n must be <= 256.", 400, param="n")
        prompt = self._render_chat(req)
        plen = len(prompt["prompt_token_ids"])
        mt = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = self._check_length(plen, mt, "messages")
        k = (req.top_logprobs or 0) if req.logprobs else None
        params = self._params(req, max_tokens, k)
        job = _Job(self.aengine, random_id("chatcmpl"), raw_request)
        await job.start([prompt], params)
        meta = dict(id=job.base_id, created=now(), model=model)
        if req.stream:
            return self._chat_stream(job, req, plen, meta, k)
        try:
            final = None
            while not job.finished:
                _, out = await job.next()
                if out.finished:
                    final = out
        finally:
            job.close()
        choices = []
        for o in final.outputs:
            lp = self._chat_logprobs(o.token_ids, o.logprobs or [], k) if k is not None else None
            choices.append({"index": o.index,
                            "message": {"role": "assistant", "content": o.text,
                                        "tool_calls": []},
                            "logprobs": lp, "finish_reason": o.finish_reason,
                            "stop_reason": o.stop_reason})
        return {**meta, "object": "chat.completion", "choices": choices,
                "usage": self._usage([plen], final.outputs)}

    async def _chat_stream(self, job: _Job, req, plen: int, meta, k) -> AsyncIterator[str]:
        n = req.n
        sent_text: dict[int, int] = {}
        sent_tok: dict[int, int] = {}
        finished: set[int] = set()
        last = None
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        base = {**meta, "object": "chat.completion.chunk"}
        try:
            for j in range(n):
                yield _sse({**base, "choices": [{"index": j, "delta": {"role": "assistant",
                                                                        "content": ""},
                                                 "logprobs": None, "finish_reason": None}]})
            while not job.finished:
                try:
                    _, out = await job.next()
                except OpenAIError as e:
                    yield _sse(e.body())
                    break
                except ClientDisconnected:
                    return
                last = out
                for o in out.outputs:
                    if o.index in finished:
                        continue
                    st, tk = sent_text.get(o.index, 0), sent_tok.get(o.index, 0)
                    delta = o.text[st:]
                    new_ids = o.token_ids[tk:]
                    if not delta and not new_ids and o.finish_reason is None:
                        continue
                    lp = (self._chat_logprobs(new_ids, (o.logprobs or [])[tk:], k)
                          if k is not None else None)
                    sent_text[o.index], sent_tok[o.index] = len(o.text), len(o.token_ids)
                    chunk = {**base, "choices": [{"index": o.index,
                                                  "delta": {"content": delta} if delta else {},
                                                  "logprobs": lp,
                                                  "finish_reason": o.finish_reason,
                                                  "stop_reason": o.stop_reason}]}
                    if o.finish_reason is not None:
                        finished.add(o.index)
                    if continuous:
                        chunk["usage"] = {"prompt_tokens": plen,
                                          "completion_tokens": len(o.token_ids),
                                          "total_tokens": plen + len(o.token_ids)}
                    yield _sse(chunk)
            else:
                if include_usage and last is not None:
                    yield _sse({**base, "choices": [], "usage": self._usage([plen], last.outputs)})
            yield "data: [DONE]\n\n"
        finally:
            job.close()
