"""Untrusted grammars compiled in worker processes first (structured_output/sandbox.py).

The default model's tokenizer (49,152 tokens) and real llguidance: a grammar of
5,000 chained rules kills a process that compiles it (stack overflow); here it
is refused with ValueError while the worker is replaced, and the regex
``(a{1000}){1000}`` (its lexer fails once text arrives) is refused too.
"""

from __future__ import annotations

import pytest

pytest.importorskip("llguidance")

from pagedjax.sampling_params import StructuredOutputsParams  # noqa: E402
from pagedjax.structured_output.grammar import GrammarCompiler, GrammarState  # noqa: E402
from pagedjax.structured_output.sandbox import SandboxLimits  # noqa: E402


def chained(n: int) -> str:
    """A Lark grammar of ``n`` rules, each calling the next."""
    return "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(n)) + f'r{n}: "b"\n'


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    c = GrammarCompiler(smollm2_tokenizer, 49152, [smollm2_tokenizer.eos_token_id])
    c.use_sandbox(SandboxLimits(workers=1, timeout_s=30.0))
    yield c
    c.sandbox.close()


def test_chained_rules_crash_the_worker_not_the_caller(compiler):
    ok = compiler.compile(StructuredOutputsParams(grammar=chained(2000)))  # as before
    assert ok.first_mask.any()
    for n in (5000, 50000):
        with pytest.raises(ValueError, match="crashed on it"):
            compiler.compile(StructuredOutputsParams(grammar=chained(n)))
    assert compiler.sandbox.num_crashes == 2
    # The refusal is remembered: no new worker is spent on the same grammar.
    with pytest.raises(ValueError, match="crashed on it"):
        compiler.compile(StructuredOutputsParams(grammar=chained(5000)))
    assert compiler.sandbox.num_crashes == 2
    # A fresh worker serves the next spec.
    assert compiler.compile(StructuredOutputsParams(regex="[0-9]{3}")).first_mask.any()


def test_lexer_that_fails_late_is_refused_up_front(compiler):
    for spec in (StructuredOutputsParams(regex="(a{1000}){1000}"),
                 StructuredOutputsParams(grammar="start: /(a{1000}){1000}/")):
        with pytest.raises(ValueError, match="structured_outputs: .*lexer"):
            compiler.compile(spec)


def test_time_budget_kills_a_slow_compile(smollm2_tokenizer):
    c = GrammarCompiler(smollm2_tokenizer, 49152, [smollm2_tokenizer.eos_token_id])
    sb = c.use_sandbox(SandboxLimits(workers=1, timeout_s=30.0))
    try:
        sb.check("regex", "x", False)  # the worker is up
        sb.limits.timeout_s = 0.05  # a{100000} takes ~0.5 s
        with pytest.raises(ValueError, match="longer than the limit of 0.05 s"):
            c.compile(StructuredOutputsParams(regex="a{100000}"))
        sb.limits.timeout_s = 30.0
        assert c.compile(StructuredOutputsParams(regex="yes|no")).first_mask.any()
    finally:
        sb.close()


def test_matcher_failure_mid_generation_is_reported(compiler, smollm2_tokenizer):
    """Without the sandbox's probe the same regex fails on the first token: the state
    says 'error' with a short message instead of raising."""
    plain = GrammarCompiler(smollm2_tokenizer, 49152, [smollm2_tokenizer.eos_token_id])
    state = GrammarState(plain, plain.compile(StructuredOutputsParams(regex="(a{1000}){1000}")))
    ids = smollm2_tokenizer.encode("aaaa", add_special_tokens=False)
    assert state.advance("s", ids) == "error"
    msg = state.error("s")
    assert "lexer" in msg and "\n" not in msg and len(msg) <= 303
