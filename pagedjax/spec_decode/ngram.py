"""N-gram prompt lookup (host side, numpy): propose the tokens that followed the
latest earlier occurrence of the sequence's own suffix.

For n from ``prompt_lookup_max`` down to ``prompt_lookup_min``: take the last n
tokens of prompt + outputs, find the latest earlier place where the same n
tokens occur, and propose up to k tokens that followed them there. The first
(longest) n with a match wins. Deterministic: the proposal distribution is
one-hot, so rejection sampling accepts a token x with probability p(x).
"""

from __future__ import annotations

import numpy as np


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_max: int,
                 prompt_lookup_min: int):
        self.k = num_speculative_tokens
        self.max_n = prompt_lookup_max
        self.min_n = prompt_lookup_min

    def propose(self, token_ids, k: int | None = None) -> list[int]:
        """Up to ``k`` (default: the configured k) proposed next tokens, maybe none."""
        k = self.k if k is None else k
        toks = np.asarray(token_ids, np.int64)
        n_tok = len(toks)
        if k <= 0 or n_tok < self.min_n + 1:
            return []
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            suffix = toks[n_tok - n:]
            # candidate starts 0..n_tok-n-1 (the suffix itself excluded)
            win = np.lib.stride_tricks.sliding_window_view(toks[:n_tok - 1], n)
            hits = np.flatnonzero((win == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return toks[start:start + k].tolist()
        return []
