"""Incremental detokenization for byte-level BPE tokenizers, by table lookup.

A byte-level BPE tokenizer (GPT-2's scheme: SmolLM2, Qwen2, Llama 3, ...)
whose decoder is ``ByteLevel`` and nothing else decodes a list of ids as
``bytes(id_0) + bytes(id_1) + ...`` read as UTF-8, invalid bytes replaced by
U+FFFD. So the text of each new token is one table lookup and one step of
Python's incremental UTF-8 decoder, which holds back a character whose bytes
have not all arrived, instead of a call into the Rust ``DecodeStream``
(``detokenizer.py``) that decodes a window of ids per token. This runs per
row per step on the engine thread.

:func:`byte_table` builds the table from the tokenizer and checks it against
the tokenizer's own ``decode`` (every id alone, and random sequences); any
difference, or a tokenizer of another kind, gives None and the engine keeps
``IncrementalDetokenizer``. ``tests/engine/test_byte_detokenizer.py`` compares the
two on real text, invalid UTF-8 and special tokens.
"""

from __future__ import annotations

from codecs import utf_8_decode
from typing import Optional, Sequence

import numpy as np

from pagedjax.engine.detokenizer import INITIAL_PREFIX_TOKENS


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet); the
    GGUF tokenizer builder (tokenizer.py) uses it too."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _token_bytes(token: str, table: dict[str, int]) -> bytes:
    """The ByteLevel decoder on one token: its characters mapped back to bytes, or
    the token's own UTF-8 when a character is outside the alphabet."""
    out = bytearray()
    for ch in token:
        b = table.get(ch)
        if b is None:
            return token.encode("utf-8")
        out.append(b)
    return bytes(out)


class ByteTable:
    """Per id: its bytes, and its text when the bytes are whole UTF-8 characters
    (else None: the id starts, ends or continues a character)."""

    __slots__ = ("bytes", "texts")

    def __init__(self, table: list[bytes]):
        self.bytes = table
        self.texts: list[Optional[str]] = []
        for b in table:
            try:
                self.texts.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                self.texts.append(None)


def byte_table(backend, skip_special_tokens: bool, num_checks: int = 64,
               seed: int = 0) -> Optional[ByteTable]:
    """id -> bytes of a ByteLevel-decoded tokenizer (``tokenizers.Tokenizer``), checked
    against its ``decode``; None when the tokenizer is not of that kind or a check
    fails."""
    if backend is None:
        return None
    try:
        from tokenizers import decoders
    except ImportError:
        return None
    if type(getattr(backend, "decoder", None)) is not decoders.ByteLevel:
        return None
    vocab = backend.get_vocab(with_added_tokens=True)  # token -> id
    size = max(vocab.values()) + 1 if vocab else 0
    added = backend.get_added_tokens_decoder()
    special = {i for i, t in added.items() if t.special}
    chars = {c: b for b, c in bytes_to_unicode().items()}
    table = [b""] * size
    for tok, i in vocab.items():
        if not (skip_special_tokens and i in special):
            table[i] = _token_bytes(tok, chars)
    # Checked against decode(): every added token and a sample of the others alone
    # (the table is built by the ByteLevel rule, so a difference shows everywhere),
    # then random sequences, which mix characters split across tokens, invalid bytes
    # and special tokens.
    rng = np.random.default_rng(seed)
    ids = sorted(set(added) | {int(i) for i in rng.integers(0, size, min(size, 2048))})
    singles = backend.decode_batch([[i] for i in ids], skip_special_tokens=skip_special_tokens)
    for i, text in zip(ids, singles):
        if table[i].decode("utf-8", "replace") != text:
            return None
    seqs = [[int(t) for t in rng.integers(0, size, int(rng.integers(1, 24)))]
            for _ in range(num_checks)]
    seqs += [[int(t) for t in rng.choice(ids, 12)] for _ in range(num_checks // 4)]
    texts = backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)
    for ids_, text in zip(seqs, texts):
        if b"".join(table[t] for t in ids_).decode("utf-8", "replace") != text:
            return None
    return ByteTable(table)


class ByteDetokenizer:
    """``IncrementalDetokenizer``'s ``add`` and ``flush`` on a byte table. Build it
    with :meth:`create`, which says None when the prompt ends inside a character
    (that case keeps the other path). It keeps no copy of the ids or the text (the
    output processor has both): per sequence it is the bytes of at most one
    character still incomplete."""

    __slots__ = ("table", "texts", "_pending", "_size")

    def __init__(self, table: ByteTable):
        self.table, self.texts = table.bytes, table.texts
        self._size = len(self.table)
        self._pending = b""  # the bytes of a character not complete yet

    @classmethod
    def create(cls, table: ByteTable, prompt_token_ids: Sequence[int]
               ) -> Optional["ByteDetokenizer"]:
        d = cls(table)
        tail = prompt_token_ids[-INITIAL_PREFIX_TOKENS:]
        if any(not 0 <= t < d._size for t in tail):
            return None
        _, used = utf_8_decode(b"".join(d.table[t] for t in tail), "replace", False)
        if used != sum(len(d.table[t]) for t in tail):
            return None  # the prompt ends inside a character
        return d

    def add(self, new_token_ids) -> str:
        """Append generated ids; return the text they complete (may be "")."""
        if type(new_token_ids) is int:
            tok = new_token_ids
            if not 0 <= tok < self._size:
                raise ValueError(f"token id {tok} is outside the vocabulary (size {self._size})")
            if not self._pending:
                text = self.texts[tok]  # the common case: a token of whole characters
                if text is not None:
                    return text
            data = self._pending + self.table[tok]
        else:
            ids = [int(t) for t in new_token_ids]
            if any(not 0 <= t < self._size for t in ids):
                raise ValueError(f"a token id in {ids} is outside the vocabulary "
                                 f"(size {self._size})")
            data = self._pending + b"".join(self.table[t] for t in ids)
        text, used = utf_8_decode(data, "replace", False)
        self._pending = data[used:]
        return text

    def flush(self) -> str:
        """Text of bytes still held back (an incomplete character at the end: U+FFFD)."""
        text, _ = utf_8_decode(self._pending, "replace", True)
        self._pending = b""
        return text
