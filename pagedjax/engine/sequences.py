"""What the engine core keeps per live sequence, between steps (host side).

A *sequence* is one scheduler request: a request's sample (n > 1 forks its
children) or a beam. :class:`Sequences` maps each live sequence to its request
and sample index, holds each request's
:class:`~pagedjax.engine.request_sampling.RequestSampling`, and keeps the views the
core's per-row loops read without further checks:

* ``steady``: sequence id -> its ``SampleRow``, reused step after step: the
  sequence's next one-sample row needs nothing but its row index and
  placeholder count (no grammar, not a fork, already reported to the output
  processor);
* ``plain``: the sequences of plain requests (``RequestSampling.plain``: one
  sample, so the sequence id is the request id), whose tokens leave the core
  as ``CoreOutput``'s two columns;
* ``topk``: a beam sequence's newest top-k logprobs, until taken.

:meth:`Sequences.forget` drops a sequence from all of them, and its request
once no sequence of it is left; ``forgotten`` remembers which request a
sequence forgotten during the current step belonged to (``begin_step`` starts one).
"""

from __future__ import annotations

from typing import Any

from pagedjax.engine.request_sampling import RequestSampling


class Sequences:
    """The core's per-sequence and per-request state (see the module docstring)."""

    def __init__(self) -> None:
        self.sampling: dict[str, RequestSampling] = {}  # request id -> sampling state
        self.root: dict[str, tuple[str, int]] = {}  # seq id -> (request id, sample index)
        self.steady: dict[str, Any] = {}  # seq id -> its inputs.SampleRow
        self.plain: set[str] = set()
        self.topk: dict[str, dict[int, float]] = {}
        self.forgotten: dict[str, str] = {}  # seq id -> request id, this step
        self.num_serial = 0  # live requests whose steps must run serially

    def begin_step(self) -> None:
        """A new step: forget which requests the sequences forgotten before it had."""
        self.forgotten = {}

    def add(self, request_id: str, s: RequestSampling) -> None:
        """A new request, with its first sequence (the same id, sample 0)."""
        self.sampling[request_id] = s
        self.num_serial += s.serial
        self.join(request_id, request_id, 0)
        if s.plain:
            self.plain.add(request_id)

    def join(self, sid: str, request_id: str, index: int) -> None:
        """Sequence ``sid`` (sample ``index``) belongs to ``request_id``."""
        self.root[sid] = (request_id, index)
        self.sampling[request_id].seqs.add(sid)

    def forget(self, sid: str) -> None:
        """Sequence ``sid`` is gone; so is its request once no sequence is left."""
        self.topk.pop(sid, None)
        self.steady.pop(sid, None)
        self.plain.discard(sid)
        ref = self.root.pop(sid, None)
        if ref is None:
            return
        self.forgotten[sid] = ref[0]
        s = self.sampling.get(ref[0])
        if s is not None:
            s.seqs.discard(sid)
            if s.grammar is not None:
                s.grammar.drop(sid)
            if not s.seqs:
                del self.sampling[ref[0]]
                self.num_serial -= s.serial

    def request_of(self, sid: str) -> str | None:
        """The request of a live sequence or of one forgotten during this step."""
        ref = self.root.get(sid)
        return ref[0] if ref is not None else self.forgotten.get(sid)

    def seq_ids(self, request_id: str) -> list[str]:
        """The live sequences of a request ([] when it has none)."""
        s = self.sampling.get(request_id)
        return list(s.seqs) if s is not None else []
