"""CompileSandbox: untrusted grammars are compiled first in worker processes.

llguidance is native code: a grammar of thousands of chained rules overflows
its stack (the process dies of SIGSEGV), and some regexes build lexers that
only blow up once text arrives. The server therefore compiles every new spec
first in a ``compile_worker`` process, under

* a time budget (``timeout_s``): a worker still busy then is killed;
* a memory budget (``memory_bytes``, the worker's address-space limit);
* a stack of ``stack_bytes`` (8 MiB), a quarter of the thread the server then
  compiles on (``grammar.SERVER_STACK_BYTES``): what compiled in the worker
  compiles in the server (llguidance is deterministic);
* a short probe walk (``probe_steps`` tokens), for lexers that fail late.

A worker that crashes, overflows or runs out of time is replaced and the spec
is refused with ``ValueError`` (an HTTP 400); only a spec the worker compiled
is then compiled in the server. At most ``workers`` processes run (started
on first use, kept while they live); a caller waits at most ``timeout_s``
for a free one and then gets :class:`SandboxBusy` (an HTTP 503).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

from pagedjax.structured_output.frames import read_frame, write_frame

logger = logging.getLogger("pagedjax.structured_output")


class SandboxBusy(RuntimeError):
    """Every compile worker stayed busy for the whole time budget."""


class _WorkerLost(Exception):
    """The worker died, or missed its deadline (and was killed)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


@dataclass
class SandboxLimits:
    timeout_s: float = 10.0
    memory_bytes: int = 4 << 30
    stack_bytes: int = 8 << 20  # grammar.SERVER_STACK_BYTES is 4x this
    probe_steps: int = 8
    workers: int = 2
    start_timeout_s: float = 120.0


class _Worker:
    def __init__(self, init: dict, start_timeout_s: float):
        env = dict(os.environ)
        env.setdefault("JAX_PLATFORMS", "cpu")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pagedjax.structured_output.compile_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.call(init, start_timeout_s)

    def call(self, msg: dict, timeout_s: float) -> dict:
        try:
            write_frame(self.proc.stdin.fileno(), msg)
        except OSError:
            raise _WorkerLost(self._death()) from None
        out = self.proc.stdout.fileno()
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            self.kill()
            raise _WorkerLost(f"compiling it took longer than the limit of {timeout_s:g} s")
        frame = read_frame(out)
        if frame is None:
            raise _WorkerLost(self._death())
        return json.loads(frame)

    def _death(self) -> str:
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = "killed"
        logger.warning("grammar compile worker died (status %s)", code)
        return ("the grammar compiler crashed on it (out of its stack or memory budget: "
                "too many chained rules or nesting too deep); simplify it")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class CompileSandbox:
    """A bounded pool of compile workers for one tokenizer (thread safe)."""

    def __init__(self, tokenizer_json: str, n_vocab: int, eos: list[int],
                 limits: Optional[SandboxLimits] = None):
        self.limits = limits or SandboxLimits()
        self._init = {"tokenizer": tokenizer_json, "n_vocab": int(n_vocab),
                      "eos": [int(t) for t in eos], "memory_bytes": self.limits.memory_bytes,
                      "stack_bytes": self.limits.stack_bytes,
                      "probe_steps": self.limits.probe_steps}
        self._idle: queue.LifoQueue = queue.LifoQueue()
        for _ in range(max(1, self.limits.workers)):
            self._idle.put(None)  # a slot; its process starts on first use
        self.num_rejected = 0
        self.num_crashes = 0

    def check(self, kind: str, value, disable_any_whitespace: bool) -> float:
        """Compile one spec in a worker: its seconds, or ValueError saying what is wrong."""
        try:
            w = self._idle.get(timeout=self.limits.timeout_s)
        except queue.Empty:
            raise SandboxBusy(f"every grammar compile worker stayed busy for "
                              f"{self.limits.timeout_s:g} s; retry later") from None
        try:
            if w is None or w.proc.poll() is not None:
                w = self._start()
            reply = w.call({"kind": kind, "value": value,
                            "disable_any_whitespace": bool(disable_any_whitespace)},
                           self.limits.timeout_s)
        except _WorkerLost as e:
            w = None
            self.num_crashes += 1
            self.num_rejected += 1
            raise ValueError(e.why) from None
        finally:
            self._idle.put(w)
        if "error" in reply:
            self.num_rejected += 1
            raise ValueError(reply["error"])
        return float(reply.get("seconds", 0.0))

    def _start(self) -> _Worker:
        try:
            return _Worker(self._init, self.limits.start_timeout_s)
        except _WorkerLost as e:
            raise SandboxBusy(f"the grammar compile worker did not start: {e.why}") from None

    def close(self) -> None:
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                return
            if w is not None:
                w.kill()


def tokenizer_json(tokenizer) -> str:
    """The tokenizers JSON of a fast HF tokenizer, as llguidance reads it."""
    import copy

    backend = copy.copy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return backend.to_str()
