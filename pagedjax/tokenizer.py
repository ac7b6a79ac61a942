"""Tokenizers (HF folder or GGUF file), incremental detokenization, stop strings.

``IncrementalDetokenizer`` turns generated token ids into text deltas. It keeps
two offsets into the token list: text is decoded from ``prefix_offset`` (a few
tokens of context, so BPE/SentencePiece leading spaces come out right) and the
new text is what lies past the decode of ``[prefix_offset, read_offset)``. A
decode that ends in U+FFFD (a multi-byte character split across tokens) is
held back until the character completes.

``StopChecker`` watches the growing output text for stop strings, which may
span deltas, truncates at the first one, and tells a streamer how many
characters are safe to send (a tail that could still become a stop string is
held back).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

# Tokens of context decoded before the first new token (vLLM uses 5 too).
INITIAL_PREFIX_TOKENS = 5
_REPLACEMENT = "\ufffd"


def _cache_root() -> Path:
    return Path(os.environ.get("PAGEDJAX_CACHE", Path.home() / ".cache" / "pagedjax")) / "tokenizers"


def _gguf_cache_dir(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    tag = hashlib.sha256(f"{gguf_path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return _cache_root() / f"{gguf_path.stem}-{tag[:12]}"


def load_tokenizer(path_or_dir: Union[str, os.PathLike], gguf_file: Optional[str] = None,
                   trust_remote_code: bool = False):
    """A fast transformers tokenizer from an HF folder / hub name or a GGUF file.

    ``path_or_dir`` may be a folder (with ``gguf_file`` naming a file in it) or
    the path of a ``.gguf`` file. Tokenizers read from GGUF are cached under
    ``~/.cache/pagedjax/tokenizers/`` (``$PAGEDJAX_CACHE``) because parsing the
    GGUF takes seconds; the cache key includes the file's size and mtime.
    """
    from transformers import AutoTokenizer

    path = Path(path_or_dir)
    if gguf_file is None and path.suffix == ".gguf" and path.is_file():
        path, gguf_file = path.parent, path.name
    if gguf_file is None:
        tok = AutoTokenizer.from_pretrained(str(path_or_dir), trust_remote_code=trust_remote_code)
    else:
        gguf_path = path / gguf_file
        if not gguf_path.is_file():
            raise ValueError(f"GGUF file not found: {gguf_path}")
        cache = _gguf_cache_dir(gguf_path)
        if (cache / "tokenizer_config.json").is_file():
            tok = AutoTokenizer.from_pretrained(str(cache))
        else:
            try:
                tok = AutoTokenizer.from_pretrained(str(path), gguf_file=gguf_file,
                                                    trust_remote_code=trust_remote_code)
            except ImportError as e:
                raise ImportError(
                    f"reading a tokenizer from {gguf_path} needs transformers' GGUF support "
                    "(the `gguf` package, and torch in this transformers version); or save it "
                    "once with save_pretrained and pass that folder.") from e
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=cache.parent))
            try:
                tok.save_pretrained(str(tmp))
                os.replace(tmp, cache)
            except OSError:  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{path_or_dir}: only fast (Rust `tokenizers`) tokenizers are supported.")
    return tok


def apply_chat_template(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True,
                        tokenize: bool = True, chat_template: Optional[str] = None,
                        **kwargs) -> Union[list[int], str]:
    """Render ``messages`` with the model's chat template.

    Returns token ids (``tokenize=True``) or the prompt text. The template
    writes its own special tokens (BOS etc.), so ids are encoded without adding
    more.
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; pass chat_template=... "
                         "or use generate() with a plain prompt.")
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                         tokenize=False, chat_template=chat_template, **kwargs)
    if not tokenize:
        return text
    return tokenizer.encode(text, add_special_tokens=False)


def bad_words_token_ids(tokenizer, bad_words: Sequence[str]) -> list[list[int]]:
    """Token sequences to ban for ``SamplingParams.bad_words``.

    Each word is encoded as written at the start of text and with a leading
    space (mid-sentence form); distinct encodings are kept.
    """
    out: list[list[int]] = []
    for word in bad_words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out


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

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: Union[int, Sequence[int]]) -> str:
        """Append generated ids; return the text they complete (may be "")."""
        if isinstance(new_token_ids, int):
            new_token_ids = [new_token_ids]
        self.token_ids.extend(int(t) for t in new_token_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset:])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""  # nothing new, or a character still incomplete: wait
        delta = full_text[len(prefix_text):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.output_text += delta
        return delta

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

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False):
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_len = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.stopped: Optional[str] = None
        self._sent = 0

    def add(self, delta: str) -> Optional[str]:
        if self.stopped is not None:
            return self.stopped
        start = max(len(self.text) - self.max_len + 1, 0)
        self.text += delta
        if not self.stop:
            return None
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
