"""Response pieces shared by the endpoints: SSE lines, usage, logprobs in OpenAI's shapes."""

from __future__ import annotations

import json
from typing import Any, Callable

from pagedjax.structured_output.grammar import CONFLICT


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def openai_finish(o) -> tuple[Any, Any]:
    """(finish_reason, stop_reason) of an engine output as OpenAI names them: an output
    that failed while generating ('error', e.g. its grammar's matcher) ends with 'stop'
    and the caller reports ``generation_error(o)`` next to it."""
    if o.finish_reason == "error":
        return "stop", None
    return o.finish_reason, o.stop_reason


def generation_error(o):
    """The OpenAIError of an output that failed while generating, else None: a 400 when
    its allowed_token_ids and structured output left no common token, else a 500."""
    from pagedjax.entrypoints.openai.errors import OpenAIError

    if o.finish_reason != "error":
        return None
    if str(o.stop_reason or "").startswith(CONFLICT):  # the request's constraints, not us
        return OpenAIError(str(o.stop_reason), 400, param="allowed_token_ids",
                           code="conflicting_constraints")
    return OpenAIError(str(o.stop_reason or "generation failed"), 500, type="server_error",
                       code="generation_failed")


def prompt_len(out, default: int) -> int:
    """The prompt tokens the engine ran for a RequestOutput: its prompt with each
    image expanded to its placeholder tokens (``default`` when it carries none)."""
    ids = getattr(out, "prompt_token_ids", None)
    return len(ids) if ids else default


def usage(prompt_lens: list[int], num_completion_tokens: int) -> dict:
    p = sum(prompt_lens)
    return {"prompt_tokens": p, "completion_tokens": num_completion_tokens,
            "total_tokens": p + num_completion_tokens}


def legacy_logprobs(token_ids, lps, offset: int, k: int, decode: Callable[[int], str]) -> dict:
    """Completions' ``logprobs`` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for tid, d in zip(token_ids, lps):
        lp = d.get(tid) if d is not None else None
        tok = lp.decoded_token if lp is not None and lp.decoded_token is not None else decode(tid)
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
                s = e.decoded_token if e.decoded_token is not None else decode(t)
                top.setdefault(s, max(e.logprob, -9999.0))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(token_ids, lps, k: int, decode: Callable[[int], str]) -> dict:
    """Chat's ``logprobs`` object (content: token, logprob, bytes, top_logprobs)."""
    content = []
    for tid, d in zip(token_ids, lps):
        lp = d.get(tid)
        tok = lp.decoded_token if lp and lp.decoded_token is not None else decode(tid)
        top = []
        for t, e in sorted(d.items(), key=lambda kv: kv[1].rank or 0):
            if e.rank is not None and e.rank <= k:
                s = e.decoded_token if e.decoded_token is not None else decode(t)
                top.append({"token": s, "logprob": max(e.logprob, -9999.0),
                            "bytes": list(s.encode("utf-8"))})
        content.append({"token": tok, "logprob": max(lp.logprob, -9999.0) if lp else None,
                        "bytes": list(tok.encode("utf-8")), "top_logprobs": top[:k]})
    return {"content": content}
