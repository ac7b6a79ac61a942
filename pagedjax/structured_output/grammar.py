"""Structured outputs: grammars compiled by llguidance, one matcher per sequence (host side).

``StructuredOutputsParams`` (``sampling_params.py``) names the constraint: a
JSON schema, a regex, a choice list, a Lark/GBNF grammar or "any JSON object".
This module turns it into token masks:

* :class:`GrammarCompiler` (one per engine) builds llguidance's tokenizer view
  once (lazily, ~0.5 s for a 49k vocabulary), checks a spec and compiles it
  into a template ``LLMatcher``. Compiled grammars are cached by (kind, spec,
  options; a digest) in a bounded LRU, so a repeated schema costs a dictionary
  lookup; refused specs are remembered the same way. Errors in the spec raise
  ``ValueError`` with llguidance's message. With :meth:`use_sandbox` (the
  server always) a new spec is compiled first in a worker process
  (``sandbox.py``), so a grammar that would crash or stall the compiler is
  refused instead. Thread safe: ``AsyncLLM`` compiles in its worker pool before
  the request reaches the engine thread, so the step loop only ever sees cache
  hits.
* :class:`GrammarState` (one per request) holds one matcher per sequence (n > 1
  children get their own), copied from the template. A matcher follows its
  sequence's output tokens (``sync``): new tokens are consumed, and if the
  sequence lost tokens (replaced or rolled back) the matcher rolls back. A
  preempted request keeps its output tokens (it recomputes them), so its
  matcher needs nothing.
* :meth:`GrammarState.mask` gives the next-token mask of a sequence as a packed
  ``uint32[ceil(V/32)]`` (bit ``t % 32`` of word ``t // 32`` set = token ``t``
  allowed), ``V`` being the model's logits width. Ids the tokenizer does not
  have (the model's padding rows) are always banned. The sampler ANDs it into
  its ``allowed_bits`` (see ``sampler.py``) on the device.

EOS is allowed only when the grammar accepts; once the grammar cannot take
another token (``is_stopped``) the engine finishes the sequence with
``finish_reason="stop"`` right away instead of spending a step on EOS. A
matcher that fails while generating (a lexer over its limits) ends its
sequence with ``finish_reason="error"`` and the matcher's message as
``stop_reason``.

With ``allowed_token_ids`` beside the grammar, the two may admit no common
token. Before the first token that refuses the request (ValueError); later, a
sequence whose next-token mask meets none of its allowed ids ends with
``finish_reason="error"`` and a ``stop_reason`` that starts with
:data:`CONFLICT` (the server answers 400: the request's constraints conflict).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np

from pagedjax.sampling_params import StructuredOutputsParams
from pagedjax.utils import bit_ids, token_bits

logger = logging.getLogger("pagedjax.structured_output")

CACHE_SIZE = 256  # compiled grammars kept (LRU), and as many refused specs
MAX_ERROR_CHARS = 300
# With a sandbox, the server compiles on a thread of this stack: 4x the compile
# workers' (sandbox.SandboxLimits.stack_bytes), whatever the process's default.
SERVER_STACK_BYTES = 32 << 20
# How the stop_reason of a sequence starts when its allowed_token_ids and its grammar
# left no common next token: the request's own constraints conflict (not an engine fault).
CONFLICT = "allowed_token_ids and the structured output admit no common token"


def call_with_stack(fn, stack_bytes: int):
    """``fn()`` on a new thread whose stack is ``stack_bytes``; its result or exception."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e
    with _STACK_LOCK:  # threading.stack_size is process-wide: set, start, restore
        old = threading.stack_size(stack_bytes)
        try:
            t = threading.Thread(target=run, name="grammar-compile")
            t.start()
        finally:
            threading.stack_size(old)
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


_STACK_LOCK = threading.Lock()


def parser_limits():
    """llguidance's limits for every matcher (defaults, short error messages)."""
    from llguidance import LLParserLimits

    return LLParserLimits(verbose_errors=False)


def short_error(message: str) -> str:
    """The first line of a compiler message, cut to ``MAX_ERROR_CHARS``."""
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS] + "..."


def _spec_key(spec: StructuredOutputsParams) -> tuple:
    kind = spec.kind
    if kind == "json":
        v = spec.json if isinstance(spec.json, str) else json.dumps(spec.json, sort_keys=True)
    elif kind == "choice":
        v = json.dumps(spec.choice)
    elif kind == "json_object":
        v = ""
    else:
        v = getattr(spec, kind)
    return kind, v, spec.disable_any_whitespace


def _digest(key: tuple) -> str:
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for a spec (not yet checked against the tokenizer)."""
    from llguidance import LLMatcher, grammar_from

    kind = spec.kind
    if kind in ("json", "json_object"):
        schema: Any = {"type": "object"} if kind == "json_object" else spec.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from e
        if not isinstance(schema, (dict, bool)):
            raise ValueError("structured_outputs.json must be a JSON schema (an object), got "
                             f"{type(schema).__name__}.")
        opts = {"whitespace_flexible": not spec.disable_any_whitespace}
        try:
            return LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=opts)
        except (ValueError, TypeError) as e:
            raise ValueError(f"invalid JSON schema in structured_outputs.json: {e}") from e
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        return LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c) for c in spec.choice))
    return grammar_from("grammar", spec.grammar)  # Lark, or GBNF (converted to Lark)


class CompiledGrammar:
    """A checked grammar: a template matcher (never advanced) and its first mask."""

    def __init__(self, key: tuple, template, first_mask: np.ndarray, seconds: float):
        self.key = key
        self.template = template
        self.first_mask = first_mask  # u32[W]: the mask before any output token
        self.compile_seconds = seconds

    def new_matcher(self):
        return self.template.deep_copy()


class GrammarCompiler:
    """Checks and compiles StructuredOutputsParams for one tokenizer (cached, thread safe)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int],
                 cache_size: int = CACHE_SIZE):
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)  # the model's logits width
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.cache_size = cache_size
        self._cache: collections.OrderedDict[str, CompiledGrammar] = collections.OrderedDict()
        self._refused: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.sandbox = None  # sandbox.CompileSandbox: new specs compiled there first
        self._lock = threading.Lock()
        self._ll = None
        self._ll_refused: Optional[str] = None  # why llguidance cannot read the tokenizer
        self._valid: Optional[np.ndarray] = None  # u32[W]: ids the tokenizer has
        self.hits = 0
        self.misses = 0

    def use_sandbox(self, limits=None):
        """Compile every new spec first in worker processes (``sandbox.py``). With a
        tokenizer the grammar library cannot read there is nothing to compile: logged,
        no workers started, None returned (constrained requests get ``unavailable``'s
        ValueError)."""
        from pagedjax.structured_output.sandbox import CompileSandbox, tokenizer_json

        why = self.unavailable
        if why is not None:
            logger.warning("%s; every request with structured_outputs will be refused", why)
            return None
        self.sandbox = CompileSandbox(tokenizer_json(self.tokenizer), self.vocab_size,
                                      self.eos_token_ids, limits)
        return self.sandbox

    @property
    def unavailable(self) -> Optional[str]:
        """Why structured outputs cannot work with this tokenizer (the grammar library
        cannot read it, e.g. a WordPiece decoder), or None when they can."""
        try:
            self.ll_tokenizer()
        except ValueError as e:
            return str(e)
        return None

    @property
    def num_words(self) -> int:
        return (self.vocab_size + 31) // 32

    def ll_tokenizer(self):
        """llguidance's view of the tokenizer (built once, ~0.5 s). A tokenizer it
        cannot read raises ValueError saying so, every time (tried once)."""
        with self._lock:
            if self._ll_refused is not None:
                raise ValueError(self._ll_refused)
            if self._ll is None:
                import llguidance.hf

                try:
                    self._ll = llguidance.hf.from_tokenizer(
                        self.tokenizer, n_vocab=self.vocab_size,
                        eos_token=self.eos_token_ids or None)
                except ValueError as e:  # e.g. a WordPiece decoder
                    self._ll_refused = ("structured_outputs are not available for this model: "
                                        "the grammar library cannot read its tokenizer "
                                        f"({short_error(str(e))})")
                    raise ValueError(self._ll_refused) from None
                n_real = min(len(self.tokenizer), self.vocab_size)
                self._valid = token_bits(np.arange(n_real), self.num_words)
            return self._ll

    @property
    def valid_mask(self) -> np.ndarray:
        """u32[ceil(V/32)]: the ids the tokenizer has (padding ids of the model banned)."""
        self.ll_tokenizer()
        return self._valid

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        """A compiled grammar for ``spec`` (from the cache when seen before).

        Raises ValueError naming the problem when the schema, regex or grammar is invalid.
        """
        if not isinstance(spec, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(spec).__name__}.")
        key = _digest(_spec_key(spec))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
            refused = self._refused.get(key)
        if refused is not None:
            raise ValueError(refused)
        try:
            compiled = self._compile(spec, key)
        except ValueError as e:
            self._remember(self._refused, key, str(e))
            raise
        with self._lock:
            self.misses += 1
        self._remember(self._cache, key, compiled)
        return compiled

    def _remember(self, table: collections.OrderedDict, key: str, value) -> None:
        with self._lock:
            table[key] = value
            while len(table) > self.cache_size:
                table.popitem(last=False)

    def _compile(self, spec: StructuredOutputsParams, key: str) -> CompiledGrammar:
        ll = self.ll_tokenizer()
        t0 = time.perf_counter()
        if self.sandbox is not None:
            kind, value, dws = _spec_key(spec)
            try:
                self.sandbox.check(kind, value, dws)
            except ValueError as e:
                raise ValueError(f"invalid {spec.kind} in structured_outputs: "
                                 f"{short_error(str(e))}") from None
            return call_with_stack(lambda: self._build(spec, key, ll, t0), SERVER_STACK_BYTES)
        return self._build(spec, key, ll, t0)

    def _build(self, spec: StructuredOutputsParams, key: str, ll, t0: float) -> CompiledGrammar:
        from llguidance import LLMatcher

        text = grammar_text(spec)
        is_error, msgs = LLMatcher.validate_grammar_with_warnings(text, ll,
                                                                   limits=parser_limits())
        if is_error:
            raise ValueError(f"invalid {spec.kind} in structured_outputs: "
                             f"{short_error(msgs[0]) if msgs else 'rejected by the compiler'}")
        template = LLMatcher(ll, text, log_level=0, limits=parser_limits())
        if template.is_error():
            raise ValueError(f"invalid {spec.kind} in structured_outputs: "
                             f"{short_error(template.get_error())}")
        first = self.fill_mask(template.deep_copy())
        return CompiledGrammar(key, template, first, time.perf_counter() - t0)

    def fill_mask(self, matcher) -> np.ndarray:
        """The matcher's next-token mask, u32[ceil(V/32)], padding ids banned."""
        from llguidance.numpy import fill_next_token_bitmask

        out = np.zeros((1, self.num_words), np.int32)
        fill_next_token_bitmask(matcher, out, 0)
        return out[0].view(np.uint32) & self._valid

    def cache_info(self) -> dict:
        with self._lock:
            return {"size": len(self._cache), "hits": self.hits, "misses": self.misses}


class GrammarState:
    """The matchers of one request's sequences (created on first use, n > 1 included).

    With ``start_after`` (token ids) a sequence is free until they appear in its
    output; the grammar constrains the tokens after their first occurrence."""

    def __init__(self, compiler: GrammarCompiler, compiled: CompiledGrammar,
                 start_after: Optional[Sequence[int]] = None,
                 allowed_token_ids: Optional[Sequence[int]] = None):
        self.compiler = compiler
        self.compiled = compiled
        # u32[W] of allowed_token_ids (None: every id); a sequence whose grammar mask
        # meets none of them is in conflict from that output position on.
        self.allowed = None if allowed_token_ids is None else \
            token_bits(allowed_token_ids, compiler.num_words)
        # seq id -> (its outputs when its mask met none of them, that mask)
        self._conflicts: dict[str, tuple[int, np.ndarray]] = {}
        self._matchers: dict[str, list] = {}  # seq id -> [matcher, tokens consumed]
        self._failures: dict[str, str] = {}  # seq id -> an exception's message
        self.start_after = list(start_after) if start_after else None
        self._start: dict[str, int] = {}  # seq id -> output index the grammar starts at
        self._scanned: dict[str, int] = {}  # seq id -> outputs searched for start_after
        if self.allowed is not None and self.start_after is None:
            if not (compiled.first_mask & self.allowed).any():
                raise ValueError(f"{CONFLICT} for the first output token: "
                                 f"{_some_ids(compiled.first_mask)}; add one of them to "
                                 "allowed_token_ids or change the structured output")

    def _offset(self, seq_id: str, output_ids: Sequence[int]) -> Optional[int]:
        """Where the constrained part of the output begins; None while still free."""
        pat = self.start_after
        if pat is None:
            return 0
        n, k = len(output_ids), len(pat)
        off = self._start.get(seq_id)
        if off is not None and off <= n:
            return off
        if off is not None:  # the marker was rolled back: free again
            del self._start[seq_id]
            self._matchers.pop(seq_id, None)
        i = max(0, min(self._scanned.get(seq_id, 0), n) - k + 1)
        while i + k <= n:
            if list(output_ids[i:i + k]) == pat:
                self._start[seq_id] = i + k
                return i + k
            i += 1
        self._scanned[seq_id] = n
        return None

    @property
    def open_mask(self) -> np.ndarray:
        """Every token the tokenizer has (a placeholder until the real mask is known)."""
        return self.compiler.valid_mask

    def sync(self, seq_id: str, output_ids: Sequence[int]):
        """The sequence's matcher, advanced (or rolled back) to ``output_ids``."""
        entry = self._matchers.get(seq_id)
        if entry is None:
            entry = self._matchers[seq_id] = [self.compiled.new_matcher(), 0]
        m, done = entry
        n = len(output_ids)
        if n < done:
            m.rollback(done - n)
            done = n
        if n > done:
            m.consume_tokens([int(t) for t in output_ids[done:n]])
        entry[1] = n
        return m

    def mask(self, seq_id: str, output_ids: Sequence[int], fork: bool = False) -> np.ndarray:
        """Next-token mask of a sequence (``fork``: a new n > 1 sample, no outputs yet).
        A mask that meets none of ``allowed_token_ids`` marks the sequence in conflict
        (its next token ends it: :meth:`advance`)."""
        m = self._mask(seq_id, output_ids, fork)
        if self.allowed is not None and not fork:
            if (m & self.allowed).any():
                self._conflicts.pop(seq_id, None)
            else:
                self._conflicts[seq_id] = (len(output_ids), m)
        return m

    def _mask(self, seq_id: str, output_ids: Sequence[int], fork: bool) -> np.ndarray:
        if fork:
            return self.compiler.valid_mask if self.start_after else self.compiled.first_mask
        off = self._offset(seq_id, output_ids)
        if off is None:
            return self.compiler.valid_mask
        output_ids = output_ids[off:] if off else output_ids
        if not output_ids and seq_id not in self._matchers:
            return self.compiled.first_mask
        return self.compiler.fill_mask(self.sync(seq_id, output_ids))

    def advance(self, seq_id: str, output_ids: Sequence[int]) -> Optional[str]:
        """Consume the sequence's new tokens. Returns None while it may go on,
        'done' when the grammar is complete, 'error' if a token broke it, 'conflict'
        if its last token was sampled where allowed_token_ids and the grammar had no
        common token (that token is not the grammar's: drop it)."""
        at, grammar_mask = self._conflicts.get(seq_id, (None, None))
        if at is not None and len(output_ids) > at:
            self._failures[seq_id] = (f"{CONFLICT} after {at} output token{'s' * (at != 1)}: "
                                      f"{_some_ids(grammar_mask)}")
            return "conflict"
        off = self._offset(seq_id, output_ids)
        if off is None:
            return None
        try:
            m = self.sync(seq_id, output_ids[off:] if off else output_ids)
        except (ValueError, RuntimeError) as e:  # a token the matcher cannot take
            self._failures[seq_id] = str(e)
            return "error"
        if m.is_error():
            return "error"
        if m.is_stopped():
            return "done"
        return None

    def error(self, seq_id: str) -> str:
        """The matcher's error, short (for ``stop_reason`` and the client)."""
        if seq_id in self._failures:
            return short_error(self._failures[seq_id])
        entry = self._matchers.get(seq_id)
        return short_error(entry[0].get_error()) if entry is not None else ""

    def drop(self, seq_id: str) -> None:
        self._matchers.pop(seq_id, None)
        self._failures.pop(seq_id, None)
        self._start.pop(seq_id, None)
        self._scanned.pop(seq_id, None)
        self._conflicts.pop(seq_id, None)


def _some_ids(mask: np.ndarray, show: int = 8) -> str:
    """'the grammar allows N tokens here, e.g. ids [..]' of a packed mask."""
    ids = bit_ids(mask)
    head = ", ".join(map(str, ids[:show])) + (", ..." if len(ids) > show else "")
    return f"the grammar allows {len(ids)} token{'s' * (len(ids) != 1)} there (ids {head})"
