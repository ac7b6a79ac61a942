"""Small helpers every layer may use (no imports of pagedjax)."""

from __future__ import annotations

import numpy as np


def cdiv(a: int, b: int) -> int:
    """Ceiling division for ints and numpy ints: the pages that ``a`` tokens fill."""
    return -(-a // b)


def token_bits(ids, num_words: int) -> np.ndarray:
    """u32[num_words] with bit ``t % 32`` of word ``t // 32`` set for each token id ``t``:
    the sampler's ``allowed_bits`` row, and the structured outputs' masks."""
    bits = np.zeros(num_words * 32, np.uint8)
    bits[np.asarray(ids, np.int64)] = 1
    return np.packbits(bits, bitorder="little").view("<u4").copy()


def bit_ids(words: np.ndarray) -> np.ndarray:
    """The token ids whose bits are set in ``words`` (u32, :func:`token_bits`' packing)."""
    return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
