"""Build :class:`AttentionMetadata` for a ragged batch on the host (numpy).

For tests, notebooks and simple loops; the engine's runner builds its own
padded batches. Each sequence is described by its page ids, how many of its
tokens are already in the pool, and how many new tokens this step brings.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from pagedjax.models.base import AttentionMetadata


@dataclasses.dataclass(frozen=True)
class SeqChunk:
    pages: Sequence[int]  # physical page ids of the sequence, in order
    num_computed: int  # tokens already written to the pool
    num_new: int  # tokens in this step


def build_metadata(
    chunks: Sequence[SeqChunk],
    page_size: int,
    *,
    pad_tokens_to: int | None = None,
    pad_seqs_to: int | None = None,
    pages_per_seq: int | None = None,
    max_q_len: int | None = None,
) -> AttentionMetadata:
    """Metadata for the chunks in order; padded tokens write to slot 0 (null page)."""
    positions, slots = [], []
    for c in chunks:
        pos = np.arange(c.num_computed, c.num_computed + c.num_new)
        need = -(-(c.num_computed + c.num_new) // page_size)
        if len(c.pages) < need:
            raise ValueError(f"chunks: a sequence needs {need} pages, has {len(c.pages)}")
        pages = np.asarray(c.pages, np.int64)
        positions.append(pos)
        slots.append(pages[pos // page_size] * page_size + pos % page_size)
    t = sum(c.num_new for c in chunks)
    s = len(chunks)
    tp = max(pad_tokens_to or t, t, 1)
    sp = max(pad_seqs_to or s, s, 1)
    p = max([pages_per_seq or 1] + [len(c.pages) for c in chunks])
    pos_a = np.zeros(tp, np.int32)
    slot_a = np.zeros(tp, np.int32)
    if t:
        pos_a[:t] = np.concatenate(positions)
        slot_a[:t] = np.concatenate(slots)
    kv_lens = np.zeros(sp, np.int32)
    page_table = np.zeros((sp, p), np.int32)
    cu = np.zeros(sp + 1, np.int32)
    for i, c in enumerate(chunks):
        kv_lens[i] = c.num_computed + c.num_new
        page_table[i, : len(c.pages)] = c.pages
        cu[i + 1] = cu[i] + c.num_new
    cu[s + 1:] = cu[s]
    if max_q_len is None:
        max_q_len = max([c.num_new for c in chunks] + [1])
    return AttentionMetadata(
        positions=jnp.asarray(pos_a),
        slot_mapping=jnp.asarray(slot_a),
        kv_lens=jnp.asarray(kv_lens),
        page_table=jnp.asarray(page_table),
        cu_q_lens=jnp.asarray(cu),
        num_seqs=jnp.asarray(s, jnp.int32),
        max_q_len=max_q_len,
    )
