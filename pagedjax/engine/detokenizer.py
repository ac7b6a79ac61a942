"""Generated token ids -> text: the incremental detokenizer and stop strings.

``IncrementalDetokenizer`` turns token ids into text deltas the way vLLM's
does (a prefix window decoded twice, an incomplete character held back), so
that streamed text equals the decode of all output ids in the context of the
prompt. ``StopChecker`` finds stop strings in the streamed text and says how
much of it is safe to stream. Both run per token on the engine thread; loading
tokenizers and chat templates is ``tokenizer.py``.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

INITIAL_PREFIX_TOKENS = 5
_REPLACEMENT = "\ufffd"


def _fast_decode():
    """transformers' PreTrainedTokenizerFast.decode (to check a tokenizer does not
    override it)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.decode


def rust_backend(tokenizer):
    """The tokenizer's Rust ``tokenizers.Tokenizer`` when decoding through it directly
    gives transformers' text (no clean-up pass, ``decode`` not overridden), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True) or \
            type(tokenizer).decode is not _fast_decode():
        return None
    return backend


def _make_stream(backend, primer: Sequence[int], skip_special_tokens: bool):
    """A tokenizers DecodeStream that has seen ``primer`` (the context before the
    first output), or None without a Rust backend or DecodeStream."""
    if backend is None:
        return None
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    stream = DecodeStream(skip_special_tokens=skip_special_tokens)
    text = ""
    try:
        for t in primer:
            text = stream.step(backend, int(t))
    except Exception:  # noqa: BLE001 - a prompt the stream rejects: decode ourselves
        return None
    # A context ending in an incomplete character (or a token without text): the
    # stream would emit it with the first output; the two-decode path does not.
    return stream if text or not primer else None


class IncrementalDetokenizer:
    """Token ids in, text deltas out; ``"".join(deltas) + flush()`` equals the
    decode of the output ids in the context of the prompt."""

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int] = (),
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # Fast tokenizers decode special tokens without extra spaces; the flag
        # is kept for API parity with vLLM (it only affects slow tokenizers).
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.read_offset = len(self.token_ids)
        self.prefix_offset = max(self.read_offset - INITIAL_PREFIX_TOKENS, 0)
        self.output_text = ""
        # transformers' decode of a fast tokenizer is the backend's decode plus an
        # optional clean-up pass; without that pass, call the backend ourselves.
        self._backend = rust_backend(tokenizer)
        # With the Rust tokenizer, its DecodeStream does the same windowed decode
        # in one call per token (as vLLM V1's fast detokenizer does), primed with
        # the prompt's last tokens; the two-decode path stays the fallback.
        self._stream = _make_stream(self._backend, self.token_ids[self.prefix_offset:],
                                    skip_special_tokens)

    def _decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:  # the Rust tokenizer directly: same text, less Python
            return self._backend.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: Union[int, Sequence[int]]) -> str:
        """Append generated ids; return the text they complete (may be "")."""
        ids = self.token_ids
        if isinstance(new_token_ids, int):
            ids.append(new_token_ids)
        else:
            ids.extend(int(t) for t in new_token_ids)
        if self._stream is not None:
            delta = self._stream_step(new_token_ids)
            if delta is not None:
                return delta
        prefix_text = self._decode(ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(ids[self.prefix_offset:])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""  # nothing new, or a character still incomplete: wait
        delta = full_text[len(prefix_text):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.output_text += delta
        return delta

    def _stream_step(self, new_token_ids) -> str | None:
        """The DecodeStream's delta (None: fall back to the two-decode path, for
        good: a stream that rejected a token cannot be trusted afterwards)."""
        try:
            text = self._stream.step(self._backend, new_token_ids)
        except Exception:  # noqa: BLE001 - e.g. "Invalid prefix": decode the window ourselves
            self._stream = None
            return None
        if not text:
            return ""  # an incomplete character: held back, as below
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.output_text += text
        return text

    def flush(self) -> str:
        """Text of tokens still held back (e.g. an incomplete character at the end)."""
        if self.read_offset == len(self.token_ids):
            return ""
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset:])
        delta = full_text[len(prefix_text):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.output_text += delta
        return delta


class StopChecker:
    """Find stop strings in streamed output text.

    ``add(delta)`` appends a delta and returns the stop string matched (the one
    that starts earliest; on a tie, the first listed), else None. After a match
    ``text`` is cut before the stop string, or after it when
    ``include_stop_str_in_output``. ``num_safe_chars`` is how much of ``text``
    can be streamed now; ``take_safe()`` returns the not-yet-streamed part.
    """

    __slots__ = ("stop", "include_stop_str_in_output", "max_len", "text", "stopped", "_sent")

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False):
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_len = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.stopped: Optional[str] = None
        self._sent = 0

    def add(self, delta: str) -> Optional[str]:
        if not self.stop:  # nothing to find
            self.text += delta
            return None
        if self.stopped is not None:
            return self.stopped
        start = max(len(self.text) - self.max_len + 1, 0)
        self.text += delta
        best: Optional[tuple[int, str]] = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[:i + len(s)] if self.include_stop_str_in_output else self.text[:i]
        self.stopped = s
        return s

    @property
    def num_safe_chars(self) -> int:
        if self.stopped is not None or not self.stop:
            return len(self.text)
        t = self.text
        for n in range(min(self.max_len - 1, len(t)), 0, -1):
            tail = t[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return len(t) - n
        return len(t)

    def take_safe(self) -> str:
        """The safe text not returned before (for streaming)."""
        end = max(self.num_safe_chars, self._sent)
        out = self.text[self._sent:end]
        self._sent = end
        return out
