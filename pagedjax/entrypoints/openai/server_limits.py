"""The server's reliability options: grammar compile workers and client timeouts.

``--structured-outputs-compile-*`` size the pool of grammar compile worker
processes (``structured_output/sandbox.py``); ``--timeout-*`` and
``--stream-stall-timeout`` are the HTTP deadlines of ``slow_clients.py``.
"""

from __future__ import annotations

import argparse

from pagedjax.entrypoints.openai.slow_clients import (DEFAULT_BODY_TIMEOUT_S,
                                                      DEFAULT_HEADER_TIMEOUT_S,
                                                      DEFAULT_STALL_TIMEOUT_S)
from pagedjax.structured_output.sandbox import SandboxLimits


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return v
    return parse


def add_reliability_args(p: argparse.ArgumentParser) -> None:
    d = SandboxLimits()
    p.add_argument("--structured-outputs-compile-workers", type=int, default=d.workers,
                   help="worker processes that compile each new grammar, regex or schema "
                        "before the server does (a crash or runaway there is a 400; default "
                        f"{d.workers}; 0 compiles in the server process, unguarded)")
    p.add_argument("--structured-outputs-compile-timeout", type=_positive(float),
                   default=d.timeout_s, help="seconds a grammar may take to compile (then 400; "
                                             f"default {d.timeout_s:g})")
    p.add_argument("--structured-outputs-compile-memory", type=_positive(int),
                   default=d.memory_bytes >> 20, metavar="MIB",
                   help="address space of a compile worker in MiB (default "
                        f"{d.memory_bytes >> 20})")
    p.add_argument("--timeout-headers", type=_positive(float), default=DEFAULT_HEADER_TIMEOUT_S,
                   help="seconds a client has to send a request's headers (then 408 and the "
                        f"connection is closed; default {DEFAULT_HEADER_TIMEOUT_S:g})")
    p.add_argument("--timeout-body", type=_positive(float), default=DEFAULT_BODY_TIMEOUT_S,
                   help="seconds a client has to send a request's body after its headers "
                        f"(then 408 and close; default {DEFAULT_BODY_TIMEOUT_S:g})")
    p.add_argument("--timeout-keep-alive", type=_positive(float), default=5.0,
                   help="seconds an idle kept-alive connection stays open (default 5)")
    p.add_argument("--stream-stall-timeout", type=_positive(float),
                   default=DEFAULT_STALL_TIMEOUT_S,
                   help="seconds a streaming client may read nothing before its stream is "
                        "ended, its requests aborted and the connection closed "
                        f"(default {DEFAULT_STALL_TIMEOUT_S:g})")


def sandbox_from_args(ns: argparse.Namespace, engine) -> None:
    """Compile grammars in worker processes first (unless the pool size is 0; a
    tokenizer the grammar library cannot read is the grammar compiler's to report)."""
    if ns.structured_outputs_compile_workers < 0:
        raise ValueError("--structured-outputs-compile-workers must be >= 0, got "
                         f"{ns.structured_outputs_compile_workers}")
    if ns.structured_outputs_compile_workers == 0:
        return
    engine.grammars.use_sandbox(SandboxLimits(
        timeout_s=ns.structured_outputs_compile_timeout,
        memory_bytes=ns.structured_outputs_compile_memory << 20,
        workers=ns.structured_outputs_compile_workers))
