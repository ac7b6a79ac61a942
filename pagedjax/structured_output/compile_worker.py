"""A grammar-compile worker process: untrusted specs are compiled here first.

``sandbox.CompileSandbox`` starts it as ``python -m
pagedjax.structured_output.compile_worker`` and talks to it over its stdin and
stdout in frames (4-byte big-endian length + UTF-8 JSON):

* first frame: ``{"tokenizer": <tokenizers JSON>, "n_vocab", "eos", "memory_bytes",
  "stack_bytes", "probe_steps"}``; the worker caps its address space at
  ``memory_bytes``, builds llguidance's tokenizer and answers ``{"ready": true}``;
* then one frame per spec: ``{"kind", "value", "disable_any_whitespace"}`` ->
  ``{"ok": true, "seconds": s}`` or ``{"error": "<what is wrong>"}``.

Each spec goes through what the server does with it (grammar text, validation,
the template matcher, the first mask) on a thread whose stack is
``stack_bytes`` (smaller than the server's threads), then ``probe_steps``
steps of a walk that consumes the lowest allowed non-EOS token: lexers that
blow up only once text arrives (``(a{1000}){1000}``) fail here. A crash, a
memory overflow or a runaway ends this process, never the server.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from pagedjax.sampling_params import StructuredOutputsParams
from pagedjax.structured_output.frames import read_frame, write_frame
from pagedjax.structured_output.grammar import call_with_stack, grammar_text, parser_limits


def spec_from_message(msg: dict) -> StructuredOutputsParams:
    kind, value = msg["kind"], msg["value"]
    if kind == "json_object":
        kw = {"json_object": True}
    elif kind == "choice":
        kw = {"choice": json.loads(value)}
    else:
        kw = {kind: value}
    return StructuredOutputsParams(disable_any_whitespace=bool(msg["disable_any_whitespace"]),
                                   **kw)


def check(ll, n_vocab: int, eos: list[int], spec: StructuredOutputsParams,
          probe_steps: int) -> None:
    """Compile ``spec`` as the server does and walk ``probe_steps`` tokens (ValueError)."""
    from llguidance import LLMatcher
    from llguidance.numpy import fill_next_token_bitmask

    text = grammar_text(spec)
    is_error, msgs = LLMatcher.validate_grammar_with_warnings(text, ll, limits=parser_limits())
    if is_error:
        raise ValueError(msgs[0] if msgs else "rejected by the grammar compiler")
    m = LLMatcher(ll, text, log_level=0, limits=parser_limits())
    words = np.zeros((1, (n_vocab + 31) // 32), np.int32)
    banned = set(eos)
    for _ in range(probe_steps + 1):
        if m.is_error():
            raise ValueError(m.get_error())
        fill_next_token_bitmask(m, words, 0)
        if m.is_error():
            raise ValueError(m.get_error())
        bits = np.unpackbits(words[0].view(np.uint8), bitorder="little")
        allowed = [int(t) for t in np.flatnonzero(bits[:n_vocab]) if int(t) not in banned]
        if not allowed or m.is_stopped():
            return
        m.consume_token(allowed[0])


def main() -> int:
    import resource

    import llguidance

    inp = sys.stdin.fileno()
    out = os.dup(sys.stdout.fileno())  # the protocol's own fd: stray prints go to stderr
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    first = read_frame(inp)
    if first is None:
        return 0
    init = json.loads(first)
    mem = int(init["memory_bytes"])
    if mem > 0:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    ll = llguidance.LLTokenizer(init["tokenizer"], n_vocab=int(init["n_vocab"]),
                                eos_token=init["eos"] or None)
    n_vocab, eos = int(init["n_vocab"]), [int(t) for t in init["eos"]]
    write_frame(out, {"ready": True})
    while (frame := read_frame(inp)) is not None:
        t0 = time.perf_counter()
        try:
            spec = spec_from_message(json.loads(frame))
            call_with_stack(lambda: check(ll, n_vocab, eos, spec, int(init["probe_steps"])),
                       int(init["stack_bytes"]))
            reply = {"ok": True, "seconds": time.perf_counter() - t0}
        except MemoryError:
            reply = {"error": "compiling it needs more than the compiler's memory budget"}
        except (ValueError, TypeError, RuntimeError, KeyError) as e:
            reply = {"error": str(e) or type(e).__name__}
        write_frame(out, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
