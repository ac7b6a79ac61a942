"""SchedulerOutput rows -> one padded step batch (host side: numpy arrays in a JAX pytree).

Static shapes: every step is padded to a *bucket* so that only a few programs
are ever compiled:

* decode-only steps (every row feeds one token): T = S = bucket(rows) from
  powers of two (1, 2, 4, ...), attention tiles of one row (``max_q_len=1``);
* mixed steps (some row feeds a prompt chunk): T = bucket(tokens) from powers
  of four >= 16, the last bucket being the step budget ``max_num_batched_tokens``
  (rounded up to a power of two), S = bucket(rows) from powers of two >= 8;
* P (page-table width): the XLA and C++ attention loop only as far as the
  longest context, so they always get the full width (no P buckets); the
  Pallas kernels size their grids by P, so for them P = bucket(longest
  sequence's pages) from powers of two >= 4;
* sampling rows (more than S when an n > 1 prompt completes) have their own
  bucket, powers of two >= max(8, S), so the expensive model program never
  depends on them and each S has few sampler programs; whether top logprobs
  are wanted picks one width (20).

The work is vectorized over rows and tokens: this is the host's share of every
step, on the critical path when the device is fast.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from typing import Sequence

import jax
import numpy as np

from pagedjax.models.base import AttentionMetadata
from pagedjax.sample import sampler as sampler_mod
from pagedjax.worker.page_table import PageTable
from pagedjax.sample.sampler import RowState
from pagedjax.utils import cdiv

LOGPROB_BUCKETS = (20,)  # one top-k width: fewer sampler programs


def pow2(n: int, minimum: int) -> int:
    return max(minimum, 1 << max(0, (int(n) - 1).bit_length()))


def pow4(n: int, minimum: int) -> int:
    b = minimum
    while b < n:
        b *= 4
    return b


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BatchInputs:
    """One padded step (device arrays)."""

    token_ids: jax.Array  # i32[T] (-1 where token_src says where to read it)
    token_src: jax.Array  # i32[T] index into the previous step's sampled tokens, -1: none
    meta: AttentionMetadata
    logits_index: jax.Array  # i32[S] each sequence's last token (its logits row)
    prompt_next_ids: jax.Array  # i32[T] or i32[0]: next prompt token of each position


@dataclasses.dataclass(slots=True)
class SampleRow:
    """One sampling row: which scheduled row it belongs to and its sampler state."""

    request_id: str
    row_index: int  # index into SchedulerOutput.rows
    state: RowState
    num_logprobs: int | None  # None: no logprobs wanted



class Buckets:
    """The padded shapes a runner compiles (see the module docstring)."""

    def __init__(self, page_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, attn_backend: str):
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_pages = cdiv(max_model_len, page_size)
        self.attn_backend = attn_backend

    def bucket_sizes(self, num_rows: int, num_tokens: int, max_pages: int, decode: bool):
        s = pow2(num_rows, 1 if decode else 8)
        t = s if decode else max(min(pow4(num_tokens, 16), self.t_buckets()[-1]), s)
        widths = self.p_buckets()
        p = next((w for w in widths if w >= max_pages), widths[-1])
        return t, s, p

    def t_buckets(self) -> list[int]:
        """Token buckets of mixed steps: powers of four, the last one the step budget."""
        cap = pow2(self.max_num_batched_tokens, 16)
        out, t = [], 16
        while t < cap:
            out.append(t)
            t *= 4
        return out + [cap]

    def p_buckets(self) -> list[int]:
        """Page-table widths: bucketed for the Pallas kernels (their grids depend on it),
        always the full width on CPU (its attention loops over live pages only)."""
        full = pow2(self.max_pages, 4)
        if self.attn_backend in ("xla", "cpu_native"):
            return [full]
        return [1 << i for i in range(2, full.bit_length())]


_token_ids = operator.attrgetter("token_ids")
_start_pos = operator.attrgetter("start_pos")
_num_spec = operator.attrgetter("num_spec")
_last = operator.itemgetter(-1)
_row_index = operator.attrgetter("row_index")
_state = operator.attrgetter("state")
_num_logprobs = operator.attrgetter("num_logprobs")


def sampling_rows_padded(num_sample_rows: int, s: int) -> int:
    """Sampling rows (more than S when an n > 1 prompt completes) have their own
    bucket, so the expensive model program never depends on them; at least S of
    them, so that a sampler program serves a model bucket for any number of
    sampling rows up to S (padding rows are greedy, dropped)."""
    return max(pow2(max(num_sample_rows, 1), 8), s)


def logprob_bucket(k: int | None) -> int | None:
    """The compiled top-k width serving ``k`` logprobs (None: none wanted)."""
    return None if k is None else next(b for b in LOGPROB_BUCKETS if b >= k)


def prepare(buckets: Buckets, rows, table_rows: np.ndarray, table, *,
            placeholder_src: np.ndarray | None = None, prompt_lp: dict[str, int] | None = None,
            prompt_tokens=None, lora_slots: np.ndarray | None = None, mrope=None):
    """Host-side padding of one step's model inputs. Returns (BatchInputs numpy
    pytree, (T, S, P)). ``table_rows``: each row's row in ``table`` (page_table.py's
    PageTable, or a list of them, one per KV group under a hybrid layout: the step's
    page_table is then i32[G, S, P] and its slot_mapping i32[G, T]);
    ``placeholder_src``: per row, where its placeholder reads its token in the
    previous step's sampled tokens (read only where the row's last token is -1; it
    becomes the per-token ``BatchInputs.token_src``);
    ``prompt_lp``: request id -> k for rows wanting prompt logprobs, whose full
    prompts ``prompt_tokens(request id)`` gives; ``lora_slots``: each row's LoRA
    slot (-1: none), None when LoRA is off; ``mrope``: M-RoPE models,
    ``request_id -> (table, delta) | None`` (worker/mrope.py)."""
    ps = buckets.page_size
    n_rows = len(rows)
    # The rows' columns by C-level loops (map + attrgetter: this runs per step, on the
    # critical path when the device is fast); the rest is vectorized over rows and tokens.
    toks = list(map(_token_ids, rows))
    lens_l = list(map(len, toks))
    num_tokens = sum(lens_l)
    decode = num_tokens == n_rows
    starts = np.fromiter(map(_start_pos, rows), np.int64, n_rows)
    last = np.array(list(map(_last, toks)), np.int32)
    if decode:  # one token per row: where each row's token sits is a constant of n_rows
        row_of = row_range(n_rows)
        flat, offs, last_at, pos, kv = last, row_of, row_of, starts, starts + 1
    else:
        flat = list(itertools.chain.from_iterable(toks))
        lens = np.array(lens_l, np.int64)
        ends = np.cumsum(lens)
        offs, last_at = ends - lens, ends - 1
        row_of = np.repeat(np.arange(n_rows), lens)
        pos = starts[row_of] + (np.arange(num_tokens) - offs[row_of])
        kv = starts + lens
    t, s, p = buckets.bucket_sizes(n_rows, num_tokens, cdiv(int(kv.max()), ps), decode)
    ints = np.zeros((4, t), np.int32)  # token ids, token sources, positions, slots
    token_ids, src, positions, slots = ints
    token_ids[:num_tokens] = flat
    src[:] = -1
    if placeholder_src is not None:  # the previous step's sampled token of that row
        src[last_at] = np.where(last < 0, placeholder_src, -1)
    positions[:num_tokens] = pos
    kv_lens = np.zeros(s, np.int32)
    kv_lens[:n_rows] = kv
    if isinstance(table, PageTable):
        page_table = table.gather(table_rows, p, s)
        slots[:num_tokens] = page_table[row_of, pos // ps] * ps + pos % ps
    else:  # hybrid KV groups: page_table i32[G, S, P], slot_mapping i32[G, T]
        page_table = np.stack([tb.gather(table_rows, p, s) for tb in table])
        slots = np.zeros((len(table), t), np.int32)
        slots[:, :num_tokens] = page_table[:, row_of, pos // ps] * ps + pos % ps
    if decode:
        cu, logits_index = _decode_ends(n_rows, s)
    else:
        cu = np.zeros(s + 1, np.int32)
        cu[1:n_rows + 1] = ends
        cu[n_rows + 1:] = num_tokens
        logits_index = _logits_index(rows, ends, s)
    mrope_positions = None
    if mrope is not None:  # three rotary position rows (Qwen2.5-VL)
        from pagedjax.worker.mrope import step_positions

        mrope_positions = step_positions(rows, positions, offs, mrope)
    meta = AttentionMetadata(
        positions=positions, slot_mapping=slots, kv_lens=kv_lens, page_table=page_table,
        cu_q_lens=cu, num_seqs=np.int32(n_rows), lora_slots=_token_lora(lora_slots, row_of, t),
        mrope_positions=mrope_positions, max_q_len=1 if decode else None)
    batch = BatchInputs(token_ids=token_ids, token_src=src, meta=meta,
                        logits_index=logits_index,
                        prompt_next_ids=_prompt_next_ids(rows, cu, t, prompt_lp, prompt_tokens))
    return batch, (t, s, p)


@functools.lru_cache(maxsize=64)
def row_range(n: int) -> np.ndarray:
    """0 .. n - 1, read-only (a decode step's row of each token, and each row's first
    and last token; a step's sampling order when every row samples once)."""
    rows = np.arange(n)
    rows.flags.writeable = False
    return rows


@functools.lru_cache(maxsize=64)
def _decode_ends(n_rows: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """A decode step's cu_q_lens i32[S + 1] and logits_index i32[S] for ``n_rows``
    rows of one token (read-only constants)."""
    cu = np.minimum(np.arange(s + 1, dtype=np.int32), n_rows)
    logits_index = np.zeros(s, np.int32)
    logits_index[:n_rows] = np.arange(n_rows)
    for a in (cu, logits_index):
        a.flags.writeable = False
    return cu, logits_index


def _token_lora(lora_slots, row_of, t):
    """Per token LoRA slots (padding -1: no adapter), None when LoRA is off."""
    if lora_slots is None:
        return None
    token_lora = np.full(t, -1, np.int32)
    token_lora[:len(row_of)] = np.asarray(lora_slots, np.int32)[row_of]
    return token_lora


def _logits_index(rows, ends: np.ndarray, s: int) -> np.ndarray:
    """Each row's last token; speculative rows (num_spec proposals ending the row)
    also want the logits of the positions before each proposal: appended after the
    S last-token rows, row by row, the whole index padded to a power of two (>= S:
    no change without them)."""
    n_rows = len(rows)
    nspec_l = list(map(_num_spec, rows))
    total_spec = sum(nspec_l)
    logits_index = np.zeros(pow2(s + total_spec, s), np.int32)
    logits_index[:n_rows] = ends - 1
    if total_spec:
        nspec = np.array(nspec_l, np.int64)
        spec_row = np.repeat(np.arange(n_rows), nspec)
        within = np.arange(total_spec) - np.repeat(np.cumsum(nspec) - nspec, nspec)
        logits_index[s:s + total_spec] = (ends - 1 - nspec)[spec_row] + within
    return logits_index


def _prompt_next_ids(rows, cu: np.ndarray, t: int, prompt_lp, prompt_tokens) -> np.ndarray:
    """i32[T] the next prompt token of each position of the rows wanting prompt
    logprobs (i32[0] when none does)."""
    next_ids = np.zeros(t if prompt_lp else 0, np.int32)
    if prompt_lp:
        for i, r in enumerate(rows):
            if r.request_id in prompt_lp:
                start = int(cu[i])
                full = prompt_tokens(r.request_id)
                for k in range(len(r.token_ids)):
                    nxt = r.start_pos + k + 1
                    next_ids[start + k] = full[nxt] if nxt < len(full) else 0
    return next_ids


def explicit_table(rows, width: int, group: int = 0) -> tuple[PageTable, np.ndarray]:
    """A page table holding ``rows``' whole page lists (rows built by hand, or
    for a model with no persistent batch of its own), and each row's row in it.
    ``group`` > 0: the rows' page lists of that KV group (``group_page_ids[group - 1]``;
    a row without them, a warm-up row, gives its ``page_ids``)."""
    table = PageTable(width, max(len(rows), 1))
    for i, r in enumerate(rows):
        table.set_row(i, group_pages_of(r, group), r.request_id)
    return table, np.arange(len(rows), dtype=np.int64)


def group_pages_of(row, group: int):
    """A row's page list in KV group ``group`` (its ``page_ids`` for group 0, or when
    it carries no group lists)."""
    groups = getattr(row, "group_page_ids", None)
    return row.page_ids if not group or groups is None else groups[group - 1]


def prepare_explicit(buckets: Buckets, rows, sample_rows: Sequence[SampleRow],
                     prompt_lp: dict[str, int], prompt_tokens: dict[str, list[int]] | None,
                     placeholder_src_of: dict[str, int] | None, vocab_size: int,
                     max_model_len: int, lora_slots=None, num_groups: int = 1, mrope=None):
    """A step of rows built by hand, with explicit sampling rows (``SampleRow``):
    warm-up, draft models, tests. ``placeholder_src_of``: request id -> where its
    placeholder reads its token; ``num_groups``: KV groups (one page table each);
    ``mrope``: see :func:`prepare`. Returns (BatchInputs, SamplingTensors,
    sample_index, num_logprobs, prompt_k, (T, S, P))."""
    width = buckets.p_buckets()[-1]
    tables = [explicit_table(rows, width, g)[0] for g in range(num_groups)]
    idx = np.arange(len(rows), dtype=np.int64)
    table = tables[0] if num_groups == 1 else tables
    src = None
    if placeholder_src_of:
        src = np.array([placeholder_src_of.get(r.request_id, -1) for r in rows], np.int32)
    full = prompt_tokens or {}
    batch, (t, s, p) = prepare(buckets, rows, idx, table, placeholder_src=src,
                               prompt_lp=prompt_lp,
                               prompt_tokens=full.__getitem__, lora_slots=lora_slots,
                               mrope=mrope)
    r_pad = sampling_rows_padded(len(sample_rows), s)
    sample_index = np.zeros(r_pad, np.int32)
    sample_index[:len(sample_rows)] = list(map(_row_index, sample_rows))
    st = sampler_mod.build_sampling_tensors(list(map(_state, sample_rows)), r_pad, vocab_size,
                                            max_model_len)
    wanted = [n for n in map(_num_logprobs, sample_rows) if n is not None]
    num_logprobs = logprob_bucket(max(wanted)) if wanted else None
    prompt_k = logprob_bucket(max(prompt_lp.values())) if prompt_lp else None
    return batch, st, sample_index, num_logprobs, prompt_k, (t, s, p)
