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


def test_a_tokenizer_the_grammar_library_cannot_read(tmp_path, caplog):
    """A WordPiece-decoder tokenizer: the compiler alone says structured outputs are
    unavailable (tried once), starts no compile workers, and every constrained spec
    is a ValueError that says why; the offline engine's requests get the same."""
    from transformers import AutoTokenizer

    from tests.distributed.test_parallel import save_tiny_tokenizer

    save_tiny_tokenizer(str(tmp_path), 64)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    c = GrammarCompiler(tok, 64, [tok.eos_token_id])
    why = c.unavailable
    assert why is not None and "not available for this model" in why
    with caplog.at_level("WARNING", logger="pagedjax.structured_output"):
        assert c.use_sandbox(SandboxLimits(workers=1)) is None
    assert c.sandbox is None and "not available for this model" in caplog.text
    for spec in (StructuredOutputsParams(json_object=True), StructuredOutputsParams(regex="a+")):
        with pytest.raises(ValueError, match="cannot read its tokenizer"):
            c.compile(spec)
    # an offline engine on that tokenizer: the same refusal, from the same compiler
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pagedjax import LLM, SamplingParams

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, max_position_embeddings=64)
                     ).save_pretrained(str(tmp_path))
    llm = LLM(str(tmp_path), max_model_len=64, max_num_seqs=2, num_pages=16)
    with pytest.raises(ValueError, match="cannot read its tokenizer"):
        llm.generate(["w5 w6"], SamplingParams(
            max_tokens=2, structured_outputs=StructuredOutputsParams(json_object=True)),
            use_tqdm=False)
    assert llm.generate(["w5 w6"], SamplingParams(max_tokens=2), use_tqdm=False)
