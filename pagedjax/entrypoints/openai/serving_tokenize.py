"""vLLM's ``/tokenize`` and ``/detokenize``.

``/tokenize`` takes ``prompt`` (encoded as ``/v1/completions`` would, special
tokens added unless ``add_special_tokens: false``) or ``messages`` (rendered by
the chat template as ``/v1/chat/completions`` would; no special tokens added
unless asked) and answers ``{"count", "max_model_len", "tokens"}`` (plus
``token_strs`` with ``return_token_strs``). ``/detokenize`` takes ``tokens``
and answers ``{"prompt"}``. Both run in AsyncLLM's worker pool.
"""

from __future__ import annotations

from pagedjax.entrypoints.openai.errors import OpenAIError
from pagedjax.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest


def _encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


class TokenizeServing:
    def __init__(self, serving):
        self.serving = serving  # OpenAIServing: model check, chat rendering, worker pool
        self.tokenizer = serving.tokenizer

    async def tokenize(self, req: TokenizeRequest, raw_request=None) -> dict:
        self.serving.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise OpenAIError("give exactly one of 'prompt' (text) or 'messages' (a chat).",
                              400, param="prompt" if req.prompt is None else "messages")
        llm = self.serving.llm
        if req.prompt is not None:
            special = True if req.add_special_tokens is None else req.add_special_tokens
            try:
                ids = await llm.run_in_worker(_encode, self.tokenizer, req.prompt, special)
            except (ValueError, TypeError) as e:
                raise OpenAIError(f"the prompt cannot be tokenized: {e}", 400,
                                  param="prompt") from e
        else:
            ids = await self.serving.render_chat(req, req.tools,
                                                 add_special_tokens=bool(req.add_special_tokens))
        body = {"count": len(ids), "max_model_len": self.serving.max_model_len, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = self.tokenizer.convert_ids_to_tokens(ids)
        return body

    async def detokenize(self, req: DetokenizeRequest, raw_request=None) -> dict:
        self.serving.check_model(req.model)
        vocab = len(self.tokenizer)
        bad = [t for t in req.tokens if t >= vocab]
        if bad:
            raise OpenAIError(f"token ids must be in [0, {vocab}); got {bad[:5]}.", 400,
                              param="tokens")
        text = await self.serving.llm.run_in_worker(self.tokenizer.decode, req.tokens)
        return {"prompt": text}
