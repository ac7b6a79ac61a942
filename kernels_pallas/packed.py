"""Weights packed into one buffer: their views inside a traced program, and where a
kernel finds a view's bytes to read them in place.

Every argument of a jitted call costs its dispatch host time at every call (on the
CPU about a microsecond each once a step's kernels have swept the caches), and a
step program takes hundreds of weights. The runner packs many of them into one
``uint8`` buffer (pagedjax/worker/param_pack.py) and passes that instead. Inside
the trace, :func:`views` cuts each weight back out (a slice and a bitcast, which
XLA fuses into the consumer, or drops when nothing uses it) and remembers where it
came from; a C++ kernel handed a view asks :func:`sources` and reads the buffer
itself at the view's byte offset, since XLA would copy a slice that feeds a
custom call. A view that reaches a kernel some other way (reshaped, say) is still
right: it is then read as the copy.

The table of views belongs to the thread that traces (warm-up traces programs from
several threads at once) and lives only while :func:`views` is open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

ALIGN = 64  # every packed weight starts at a multiple of this many bytes

_local = threading.local()


@dataclasses.dataclass(frozen=True)
class Entry:
    """One packed weight: its byte ``offset`` in the buffer, ``shape`` and ``dtype``."""
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(arrays: Sequence) -> tuple[list[Entry], int]:
    """Each array's entry, in order, each aligned to ``ALIGN`` bytes; and the buffer's size."""
    entries, end = [], 0
    for a in arrays:
        e = Entry(_aligned(end), tuple(int(s) for s in a.shape), np.dtype(a.dtype))
        entries.append(e)
        end = e.offset + e.nbytes
    return entries, max(_aligned(end), ALIGN)


def view(buffer: jax.Array, e: Entry) -> jax.Array:
    """The weight of entry ``e`` cut out of ``buffer`` (u8[size]), as an array of its own."""
    raw = lax.slice(buffer, (e.offset,), (e.offset + e.nbytes,))
    size = e.dtype.itemsize
    if size > 1:  # (bitcast_convert_type takes a wider type's bytes on a last axis)
        raw = raw.reshape(e.nbytes // size, size)
    return lax.bitcast_convert_type(raw, e.dtype).reshape(e.shape)


@contextlib.contextmanager
def views(buffer: jax.Array, entries: Sequence[Entry]) -> Iterator[list[jax.Array]]:
    """In a trace: the entries' views of ``buffer``, known to :func:`sources` until the
    block ends (the whole traced body belongs inside it)."""
    if buffer.dtype != jnp.uint8 or buffer.ndim != 1:
        raise ValueError(f"packed.views: expected a u8[size] buffer, got {buffer.dtype} "
                         f"{buffer.shape}")
    out = [view(buffer, e) for e in entries]
    table = getattr(_local, "table", None)
    _local.table = dict(table or {})
    # The view itself is kept in the table, so its id is not reused while it is open.
    _local.table.update((id(v), (v, buffer, e.offset)) for v, e in zip(out, entries))
    try:
        yield out
    finally:
        _local.table = table


def sources(arrays: Mapping[str, jax.Array]) -> tuple[jax.Array, dict[str, int]] | None:
    """When every one of ``arrays`` is a view (:func:`views`) of the same buffer: that
    buffer and each name's byte offset in it; otherwise None."""
    table = getattr(_local, "table", None)
    if not table:
        return None
    # (an id found is this array's: the table keeps its views alive, so no other
    # object can have their ids while it is open)
    found = {name: table.get(id(a)) for name, a in arrays.items()}
    if any(f is None for f in found.values()):
        return None
    buffers = {id(f[1]) for f in found.values()}
    if len(buffers) != 1:
        return None
    return next(iter(found.values()))[1], {n: f[2] for n, f in found.items()}
