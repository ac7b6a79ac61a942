"""Per-row sampling state -> fixed-shape sampling arrays (host side: numpy arrays in a JAX pytree).

``RowState`` is what the sampler needs of one running sequence;
``static_row`` is the part that never changes for a sequence (the persistent
batch, ``worker/input_batch.py``, keeps it as columns); ``build_sampling_tensors``
packs explicit rows (and ``tensors_from_columns`` a batch's columns plus its few
special rows) into a ``SamplingTensors`` pytree of numpy arrays whose widths
are module constants, with static feature flags (penalties, bias/bans, allowed
tokens, min-p, top-k/top-p) so the common path compiles lean. The device side
is ``sampler.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import jax
import numpy as np

from pagedjax.sampling_params import (MAX_BAD_WORDS, MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS,
                                      SAMPLING_EPS, SamplingParams)
from pagedjax.utils import token_bits

# Fixed widths (widths are part of the compiled shape; keep them constant).
MAX_EOS_TOKEN_IDS = 8
BAN_WIDTH = MAX_EOS_TOKEN_IDS + MAX_STOP_TOKEN_IDS + 2 * MAX_BAD_WORDS
EDIT_WIDTH = MAX_LOGIT_BIAS + BAN_WIDTH
_MASK32 = 0xFFFFFFFF


@dataclass(slots=True)
class RowState:
    """What the sampler needs of one running sequence (host side).

    ``fallback_seed`` seeds rows whose params have no ``seed``; the engine
    draws it (per request, or per step for fresh randomness).
    ``eos_token_ids`` are banned while ``len(output) < min_tokens`` (unless
    ``ignore_eos``). ``bad_words_token_ids`` are the tokenised ``bad_words``
    (see ``pagedjax.engine.tokenizer.bad_words_token_ids``). ``num_placeholders``
    counts outputs already sampled but not yet known on the host (overlapped
    steps): they count for the seed counter and ``min_tokens`` (requests whose
    penalties or bad words need the tokens themselves run serially, with 0).
    ``grammar_bits`` (structured outputs, ``structured_outputs.py``): the row's
    next-token mask packed as u32[ceil(V/32)], ANDed into ``allowed_bits``.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    fallback_seed: int = 0
    eos_token_ids: Sequence[int] = ()
    bad_words_token_ids: Sequence[Sequence[int]] = ()
    num_placeholders: int = 0
    grammar_bits: Optional[np.ndarray] = None
    # static_row(params, fallback_seed) when the caller has it; computed otherwise.
    static: Optional["StaticRow"] = None

    @property
    def num_outputs(self) -> int:
        return len(self.output_token_ids) + self.num_placeholders


class StaticRow(NamedTuple):
    """The part of a row's sampling state that never changes for a sequence. A tuple,
    so that equal rows compare equal and a batch's rows transpose into columns."""

    greedy: bool
    temperature: float
    top_k: int  # 0 = off
    top_p: float
    min_p: float
    seed_hi: int  # the threefry key words of the row's seed
    seed_lo: int
    extras: bool  # the row needs the per-step slow path (penalties, bans before
    # min_tokens, bad words, logit bias, allowed ids)


def static_row(params: SamplingParams, fallback_seed: int) -> StaticRow:
    """A sequence's :class:`StaticRow` (built once per sequence)."""
    p = params
    greedy = p.temperature < SAMPLING_EPS
    hi, lo = seed_words(p.seed if p.seed is not None else fallback_seed)
    extras = bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0
                  or p.min_tokens or p.logit_bias or p.allowed_token_ids is not None
                  or p.bad_words)
    if greedy:
        return StaticRow(True, 1.0, 0, 1.0, 0.0, hi, lo, extras)
    return StaticRow(False, p.temperature, p.top_k if p.top_k > 0 else 0, p.top_p, p.min_p,
                     hi, lo, extras)


@dataclass
class SamplingTensors:
    """Per-row sampling arrays for a batch of R rows (a pytree).

    Data (R = rows): temperature f32[R] (1 for greedy rows), greedy bool[R],
    top_k i32[R] (vocab size = off), top_p f32[R], min_p f32[R],
    key_data u32[R,2] (threefry key words of the seed), counter i32[R]
    (output tokens so far), presence/frequency/repetition f32[R],
    hist_ids i32[R,H] (unique history tokens, padded with vocab_size),
    hist_counts f32[R,H] (their output counts), edit_ids i32[R,E],
    edit_vals f32[R,E] (logit bias and -inf bans, padded with 0/0.0),
    allowed_bits u32[R,ceil(V/32)] (bit set = allowed: allowed_token_ids AND the
    structured-output grammar's mask; rows with neither are all ones).
    Unused features carry zero-width arrays. Static: the feature flags.
    """

    temperature: np.ndarray
    greedy: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    key_data: np.ndarray
    counter: np.ndarray
    presence: np.ndarray
    frequency: np.ndarray
    repetition: np.ndarray
    hist_ids: np.ndarray
    hist_counts: np.ndarray
    edit_ids: np.ndarray
    edit_vals: np.ndarray
    allowed_bits: np.ndarray
    all_greedy: bool = True
    use_penalties: bool = False
    use_edits: bool = False
    use_allowed: bool = False
    use_min_p: bool = False
    use_top_k_p: bool = False


_META = ("all_greedy", "use_penalties", "use_edits", "use_allowed", "use_min_p", "use_top_k_p")
jax.tree_util.register_dataclass(
    SamplingTensors,
    data_fields=[f.name for f in dataclasses.fields(SamplingTensors) if f.name not in _META],
    meta_fields=list(_META))


def _bans(row: RowState) -> list[int]:
    p = row.params
    out = row.output_token_ids
    bans: list[int] = []
    if row.num_outputs < p.min_tokens:
        bans.extend(p.stop_token_ids)
        if not p.ignore_eos:
            bans.extend(row.eos_token_ids)
            bans.extend(p.all_stop_token_ids - set(p.stop_token_ids))
    for seq in row.bad_words_token_ids:
        n = len(seq)
        if n == 0:
            continue
        if n == 1 or (len(out) >= n - 1 and list(out[len(out) - n + 1:]) == list(seq[:-1])):
            bans.append(int(seq[-1]))
    return bans


def _history_tokens(row: RowState) -> tuple[np.ndarray, np.ndarray]:
    """Tokens a penalised row has seen and whether each is an output token."""
    out = np.asarray(row.output_token_ids, dtype=np.int64)
    if row.params.repetition_penalty == 1.0:
        return out, np.ones(len(out))
    prompt = np.asarray(row.prompt_token_ids, dtype=np.int64)
    return np.concatenate([prompt, out]), np.concatenate([np.zeros(len(prompt)),
                                                          np.ones(len(out))])


def _pack_history(hist: dict[int, tuple[np.ndarray, np.ndarray]], R: int, V: int, H: int):
    """Distinct tokens per row (padded with V) and their output counts, in one np.unique."""
    ids = np.full((R, H), V, np.int32)
    counts = np.zeros((R, H), np.float32)
    if not hist:
        return ids, counts
    keys = np.concatenate([r * V + t for r, (t, _) in hist.items()])
    w = np.concatenate([w for _, w in hist.values()])
    if keys.size == 0:
        return ids, counts
    tok_all = keys - np.repeat([r * V for r in hist], [len(t) for t, _ in hist.values()])
    if tok_all.min() < 0 or tok_all.max() >= V:
        raise ValueError(f"penalty history holds a token id outside [0, {V}).")
    uniq, inv = np.unique(keys, return_inverse=True)
    cnt = np.bincount(inv, weights=w, minlength=len(uniq))
    row = uniq // V
    pos = np.arange(len(uniq)) - np.searchsorted(row, row, side="left")
    if pos.max() >= H:
        raise ValueError(
            f"a penalised row has seen {pos.max() + 1} distinct tokens but history_len is {H}; "
            "raise history_len (e.g. to max_model_len).")
    ids[row, pos] = uniq % V
    counts[row, pos] = cnt
    return ids, counts


def seed_words(seed: int) -> tuple[int, int]:
    """A seed's two threefry key words (high, low)."""
    s = int(seed) & ((1 << 64) - 1)
    return (s >> 32) & _MASK32, s & _MASK32


class SamplingColumns(NamedTuple):
    """The static sampling columns of R rows (rows past the real ones: greedy padding)."""

    greedy: np.ndarray  # bool[R]
    temperature: np.ndarray  # f32[R] (1 for greedy rows)
    top_k: np.ndarray  # i32[R] (vocab size = off)
    top_p: np.ndarray  # f32[R]
    min_p: np.ndarray  # f32[R]
    key_data: np.ndarray  # u32[R, 2] threefry key words of each row's seed


def static_columns(statics: Sequence[StaticRow], R: int, V: int) -> SamplingColumns:
    """The columns of rows' :class:`StaticRow` s, padded to R rows."""
    n = len(statics)
    cols = list(zip(*statics)) if statics else [()] * len(StaticRow._fields)
    f = {name: cols[i] for i, name in enumerate(StaticRow._fields)}
    greedy = np.ones(R, bool)
    greedy[:n] = f["greedy"]
    temperature = np.ones(R, np.float32)
    temperature[:n] = f["temperature"]
    top_k = np.full(R, V, np.int32)
    top_p = np.ones(R, np.float32)
    min_p = np.zeros(R, np.float32)
    if n:
        k = np.asarray(f["top_k"], np.int64)
        top_k[:n] = np.where((k > 0) & (k < V), k, V)
        top_p[:n] = f["top_p"]
        min_p[:n] = f["min_p"]
    key_data = np.zeros((R, 2), np.uint32)
    key_data[:n, 0] = f["seed_hi"]
    key_data[:n, 1] = f["seed_lo"]
    return SamplingColumns(greedy, temperature, top_k, top_p, min_p, key_data)


def build_sampling_tensors(rows: Sequence[RowState], num_rows_padded: int, vocab_size: int,
                           history_len: int) -> SamplingTensors:
    """Pack per-row sampling state into fixed-shape numpy arrays.

    Rows past ``len(rows)`` are greedy padding. ``history_len`` bounds the
    number of *distinct* tokens a penalised row has seen (prompt + output when
    repetition_penalty != 1, else output only). (The engine's steps take their
    static columns from the persistent batch instead: ``worker/input_batch.py``.)
    """
    R, V = num_rows_padded, vocab_size
    if len(rows) > R:
        raise ValueError(f"got {len(rows)} rows for num_rows_padded={R}; raise num_rows_padded.")
    statics = [row.static or static_row(row.params, row.fallback_seed) for row in rows]
    counter = np.zeros(R, np.int32)
    counter[:len(rows)] = [row.num_outputs for row in rows]
    special = {r: row for r, row in enumerate(rows)
               if statics[r].extras or row.bad_words_token_ids or row.grammar_bits is not None}
    return tensors_from_columns(static_columns(statics, R, V), len(rows), counter, special,
                                V, history_len)


def tensors_from_columns(cols: SamplingColumns, n: int, counter: np.ndarray,
                         special: dict[int, RowState], V: int, history_len: int
                         ) -> SamplingTensors:
    """A :class:`SamplingTensors` from ``n`` rows' static columns and seed counters
    (padded to R), and the full state of the ``special`` rows (by row): those
    needing penalties, bans, biases, allowed ids or a grammar mask."""
    R = len(cols.greedy)
    greedy, top_k, top_p, min_p = cols.greedy, cols.top_k, cols.top_p, cols.min_p
    use_tkp = bool(n) and bool(top_k[:n].min() < V or top_p[:n].min() < 1.0)
    use_min_p = bool(n) and bool(min_p[:n].max() > 0.0)
    extra = _special_arrays(special, R, V, history_len) if special else _plain_arrays(R)
    pen, hist_ids, hist_counts, edit_ids, edit_vals, allowed_bits, flags = extra
    return SamplingTensors(
        temperature=cols.temperature, greedy=greedy, top_k=top_k, top_p=top_p, min_p=min_p,
        key_data=cols.key_data, counter=counter, presence=pen[0], frequency=pen[1],
        repetition=pen[2], hist_ids=hist_ids, hist_counts=hist_counts, edit_ids=edit_ids,
        edit_vals=edit_vals, allowed_bits=allowed_bits, all_greedy=bool(greedy.all()),
        use_penalties=flags[0], use_edits=flags[1], use_allowed=flags[2],
        use_min_p=use_min_p, use_top_k_p=use_tkp)


@functools.lru_cache(maxsize=32)
def _plain_arrays(R: int) -> tuple:
    """:func:`_special_arrays` of R rows none of which is special (read-only)."""
    out = _special_arrays({}, R, 0, 0)
    for a in out[:-1]:
        a.flags.writeable = False
    return out


def _special_arrays(special: dict[int, RowState], R: int, V: int, history_len: int) -> tuple:
    """The arrays of the per-step features of R rows, from the ``special`` rows'
    states: (penalties f32[3, R], hist_ids, hist_counts, edit_ids, edit_vals,
    allowed_bits, (use_penalties, use_edits, use_allowed))."""
    pen = np.zeros((3, R), np.float32)
    pen[2] = 1.0
    use_pen = use_edits = use_allowed = False
    edits: dict[int, tuple[list[int], list[float]]] = {}
    allowed: dict[int, list[int]] = {}
    grammar: dict[int, np.ndarray] = {}
    hist: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for r, row in special.items():
        if row.grammar_bits is not None:
            grammar[r] = row.grammar_bits
            use_allowed = True
        static = row.static or static_row(row.params, row.fallback_seed)
        if not static.extras and not row.bad_words_token_ids:
            continue  # only a grammar mask
        p = row.params
        if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
            pen[:, r] = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
            hist[r] = _history_tokens(row)
            use_pen = True
        bans = _bans(row)
        if len(bans) > BAN_WIDTH:
            raise ValueError(f"{len(bans)} banned tokens exceed BAN_WIDTH={BAN_WIDTH}.")
        bias = p.logit_bias or {}
        if bans or bias:
            ids_e = list(bias.keys()) + bans
            vals_e = list(bias.values()) + [-math.inf] * len(bans)
            if max(ids_e) >= V:
                raise ValueError(f"logit_bias/banned token id {max(ids_e)} >= vocab_size {V}.")
            edits[r] = (ids_e, vals_e)
            use_edits = True
        if p.allowed_token_ids is not None:
            allowed[r] = p.allowed_token_ids
            use_allowed = True
    hist_ids, hist_counts = _pack_history(hist, R, V, history_len if use_pen else 0)
    E = EDIT_WIDTH if use_edits else 0
    edit_ids = np.zeros((R, E), np.int32)
    edit_vals = np.zeros((R, E), np.float32)
    for r, (ids_e, vals_e) in edits.items():
        edit_ids[r, :len(ids_e)] = ids_e
        edit_vals[r, :len(vals_e)] = vals_e
    allowed_bits = _allowed_bits(allowed, grammar, R, V, use_allowed)
    return (pen, hist_ids, hist_counts, edit_ids, edit_vals, allowed_bits,
            (use_pen, use_edits, use_allowed))


def _allowed_bits(allowed: dict[int, list[int]], grammar: dict[int, np.ndarray], R: int, V: int,
                  used: bool) -> np.ndarray:
    """u32[R, ceil(V/32)] (zero wide when unused): allowed_token_ids AND grammar masks."""
    W = (V + 31) // 32 if used else 0
    allowed_bits = np.full((R, W), _MASK32, np.uint32)
    for r, ids_a in allowed.items():
        a = np.asarray(ids_a, np.int64)
        if a.max() >= V:
            raise ValueError(f"allowed_token_ids holds {a.max()} >= vocab_size {V}.")
        allowed_bits[r] = token_bits(a, W)
    for r, g in grammar.items():
        if g.shape != (W,):
            raise ValueError(f"grammar_bits of row {r} has shape {g.shape}, expected ({W},) "
                             f"for vocab_size {V}.")
        allowed_bits[r] &= g
    return allowed_bits


def variant_key(st: SamplingTensors) -> tuple:
    """The static feature flags that select a compiled sampler variant."""
    return _meta_flags(st)


_meta_flags = operator.attrgetter(*_META)  # one C call (per step)
