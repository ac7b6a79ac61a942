"""How many rows of a padded step hold tokens, for the C++ kernels that skip the rest.

A step pads its tokens (T) and sequences (S) to static buckets, so a decode step of
17 sequences computes 32 rows. The runner's trace knows how many tokens are real
(``meta.cu_q_lens[-1]``, a traced scalar): inside :func:`counted` a kernel call on an
operand whose leading dimension is one of the step's padded sizes gets that count
from :func:`lookup` and computes only those rows, writing zeros for the rest
(``cpu/blockmatmul.cc``). That is right for the step's token-ordered matrices (the
padding tokens come last) and its sequence-ordered ones (the padding sequences come
last, and every real sequence has at least one token, so the token count bounds the
real sequences too). Any other call (outside a step's trace, or on another leading
dimension) gets None: every row.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterable, Iterator

_local = threading.local()  # .live: (count, padded sizes) of the trace on this thread


@contextlib.contextmanager
def counted(count: Any, sizes: Iterable[int]) -> Iterator[None]:
    """Within: matrices of ``sizes`` rows hold ``count`` (an i32 scalar) real rows first."""
    before = getattr(_local, "live", None)
    _local.live = (count, frozenset(int(s) for s in sizes))
    try:
        yield
    finally:
        _local.live = before


def lookup(rows: int) -> Any:
    """The real-row count of a ``rows``-row operand in this trace, or None (all rows)."""
    live = getattr(_local, "live", None)
    if live is None or rows not in live[1]:
        return None
    return live[0]
