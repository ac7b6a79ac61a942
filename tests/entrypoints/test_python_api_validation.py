"""The Python API checks its arguments at the call, as the server does over HTTP.

A table of bad calls to ``LLM``, ``AsyncLLM``, ``LLMEngine`` and ``SamplingParams``:
each raises the expected type (ArgumentTypeError is a TypeError and a ValueError)
with a message naming the argument and quoting the value short; nothing is
queued, and good calls on the same engines still work afterwards. The model is
a tiny random Llama with the default model's tokenizer (vocabulary 49,152).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch")

from pagedjax import LLM, AsyncLLM, SamplingParams  # noqa: E402
from pagedjax.sampling_params import StructuredOutputsParams  # noqa: E402
from tests.utils.lora import tiny_hf_model  # noqa: E402

V = 49152
KW = dict(max_model_len=64, num_pages=32, max_num_seqs=2)
SP = SamplingParams


@pytest.fixture(scope="module")
def apis(tmp_path_factory, smollm2_gguf):
    root = tmp_path_factory.mktemp("api")
    tiny_hf_model("llama", vocab=V, seed=3).save_pretrained(root / "m")
    llm = LLM(str(root / "m"), tokenizer=smollm2_gguf, **KW)
    allm = AsyncLLM.from_engine(llm.llm_engine)
    yield llm, allm, str(root / "m"), smollm2_gguf
    allm.shutdown()


def _async(allm, prompt, params=None, request_id="a"):
    async def run():
        return [o async for o in allm.generate(prompt, params, request_id)]
    return asyncio.run(run())


# (id, call(llm, allm, model_path, tokenizer), expected type, words the message must hold)
CASES = [
    # LLM.generate: prompts
    ("int prompt", lambda L, A, m, t: L.generate(123), TypeError, ["prompts", "123"]),
    ("None prompt", lambda L, A, m, t: L.generate(None), TypeError, ["prompts", "None"]),
    ("id beyond vocab", lambda L, A, m, t: L.generate({"prompt_token_ids": [10**7]}),
     ValueError, ["prompt_token_ids", "10000000", str(V)]),
    ("negative id", lambda L, A, m, t: L.generate({"prompt_token_ids": [-1]}), ValueError,
     ["prompt_token_ids", "-1"]),
    ("list id beyond vocab", lambda L, A, m, t: L.generate([5, V]), ValueError,
     ["prompt", str(V)]),
    ("str in id list", lambda L, A, m, t: L.generate([5, "a"]), TypeError, ["prompt", "'a'"]),
    ("bad entry in prompt list", lambda L, A, m, t: L.generate([[1, 2], 5]), TypeError,
     ["prompts[1]", "5"]),
    ("float prompt list", lambda L, A, m, t: L.generate([1.5]), TypeError, ["prompts[0]"]),
    ("dict prompt not str", lambda L, A, m, t: L.generate({"prompt": 5}), TypeError,
     ["prompt", "5"]),
    ("dict without prompt", lambda L, A, m, t: L.generate({"text": "hi"}), ValueError,
     ["prompt", "prompt_token_ids"]),
    ("ids not a list", lambda L, A, m, t: L.generate({"prompt_token_ids": "12"}), TypeError,
     ["prompt_token_ids"]),
    # LLM.generate: other arguments
    ("params as dict", lambda L, A, m, t: L.generate("hi", {"max_tokens": 2}), TypeError,
     ["sampling_params", "dict"]),
    ("params count", lambda L, A, m, t: L.generate(["a", "b"], [SP()]), ValueError,
     ["sampling_params", "2"]),
    ("params list entry", lambda L, A, m, t: L.generate(["a", "b"], [SP(), "x"]), TypeError,
     ["sampling_params[1]", "'x'"]),
    ("priority count", lambda L, A, m, t: L.generate("a", priority=[1, 2]), ValueError,
     ["priority"]),
    ("use_tqdm", lambda L, A, m, t: L.generate("a", use_tqdm="yes"), TypeError, ["use_tqdm"]),
    ("stop id beyond vocab", lambda L, A, m, t: L.generate("a", SP(stop_token_ids=[10**6])),
     ValueError, ["stop_token_ids", "1000000"]),
    # SamplingParams
    ("stop int", lambda *a: SP(stop=5), TypeError, ["stop", "5"]),
    ("stop list of int", lambda *a: SP(stop=[5]), TypeError, ["stop", "5"]),
    ("stop_token_ids int", lambda *a: SP(stop_token_ids=5), TypeError, ["stop_token_ids"]),
    ("stop_token_ids negative", lambda *a: SP(stop_token_ids=[-1]), ValueError,
     ["stop_token_ids", "-1"]),
    ("bad_words str", lambda *a: SP(bad_words="x"), TypeError, ["bad_words"]),
    ("logit_bias list", lambda *a: SP(logit_bias=[1]), TypeError, ["logit_bias"]),
    ("logit_bias key", lambda *a: SP(logit_bias={"abc": 1}), TypeError, ["logit_bias", "abc"]),
    ("n zero", lambda *a: SP(n=0), ValueError, ["n must", "0"]),
    ("n str", lambda *a: SP(n="2"), TypeError, ["n must", "'2'"]),
    ("n huge str", lambda *a: SP(n="x" * 10**6), TypeError, ["n must", "characters"]),
    ("temperature nan", lambda *a: SP(temperature=float("nan")), ValueError,
     ["temperature", "nan"]),
    ("temperature str", lambda *a: SP(temperature="hot"), TypeError, ["temperature", "hot"]),
    ("top_p zero", lambda *a: SP(top_p=0), ValueError, ["top_p"]),
    ("top_k", lambda *a: SP(top_k=-5), ValueError, ["top_k", "-5"]),
    ("min_p", lambda *a: SP(min_p=1.5), ValueError, ["min_p", "1.5"]),
    ("max_tokens zero", lambda *a: SP(max_tokens=0), ValueError, ["max_tokens"]),
    ("max_tokens float", lambda *a: SP(max_tokens=2.5), TypeError, ["max_tokens", "2.5"]),
    ("min_tokens", lambda *a: SP(min_tokens=-1), ValueError, ["min_tokens"]),
    ("seed range", lambda *a: SP(seed=2**70), ValueError, ["seed"]),
    ("logprobs", lambda *a: SP(logprobs=100), ValueError, ["logprobs", "100"]),
    ("presence_penalty", lambda *a: SP(presence_penalty=5), ValueError, ["presence_penalty"]),
    ("repetition_penalty", lambda *a: SP(repetition_penalty=0), ValueError,
     ["repetition_penalty"]),
    ("ignore_eos", lambda *a: SP(ignore_eos="no"), TypeError, ["ignore_eos"]),
    ("allowed_token_ids empty", lambda *a: SP(allowed_token_ids=[]), ValueError,
     ["allowed_token_ids"]),
    ("output_kind", lambda *a: SP(output_kind=7), TypeError, ["output_kind"]),
    ("structured_outputs", lambda *a: SP(structured_outputs="json"), TypeError,
     ["structured_outputs"]),
    ("structured regex", lambda *a: StructuredOutputsParams(regex=""), ValueError,
     ["structured_outputs.regex"]),
    # LLMEngine
    ("engine request_id", lambda L, A, m, t: L.llm_engine.add_request(5, "hi"), TypeError,
     ["request_id"]),
    ("engine priority", lambda L, A, m, t: L.llm_engine.add_request("r", "hi", priority="hi"),
     TypeError, ["priority"]),
    ("engine id beyond vocab", lambda L, A, m, t: L.llm_engine.add_request("r", [10**7]),
     ValueError, ["prompt", "10000000"]),
    ("engine logit_bias vocab",
     lambda L, A, m, t: L.llm_engine.add_request("r", "hi", SP(logit_bias={10**6: 1})),
     ValueError, ["logit_bias", "1000000"]),
    # AsyncLLM
    ("async int prompt", lambda L, A, m, t: _async(A, 123), TypeError, ["prompt", "123"]),
    ("async id beyond vocab", lambda L, A, m, t: _async(A, [10**7]), ValueError,
     ["prompt", "10000000"]),
    ("async negative id", lambda L, A, m, t: _async(A, {"prompt_token_ids": [-3]}), ValueError,
     ["prompt_token_ids", "-3"]),
    ("async params dict", lambda L, A, m, t: _async(A, "hi", {"n": 1}), TypeError,
     ["sampling_params"]),
    ("async request_id", lambda L, A, m, t: _async(A, "hi", None, 5), TypeError,
     ["request_id"]),
    # Constructors (refused before any model is loaded)
    ("LLM model int", lambda L, A, m, t: LLM(123), TypeError, ["model", "123"]),
    ("LLM max_model_len", lambda L, A, m, t: LLM(m, tokenizer=t, max_model_len=0), ValueError,
     ["max_model_len", "0"]),
    ("LLM memory str", lambda L, A, m, t: LLM(m, gpu_memory_utilization="high"), TypeError,
     ["gpu_memory_utilization", "high"]),
    ("LLM unknown", lambda L, A, m, t: LLM(m, bogus=1), TypeError, ["bogus"]),
    ("AsyncLLM unknown", lambda L, A, m, t: AsyncLLM(m, max_num_seqs="4"), ValueError,
     ["max_num_seqs"]),
]


def test_bad_calls_are_named_and_good_calls_still_work(apis):
    llm, allm, model, tok = apis
    assert len(CASES) >= 30
    failures = []
    for name, call, expected, words in CASES:
        try:
            call(llm, allm, model, tok)
        except Exception as e:  # noqa: BLE001 - each is checked below
            msg = str(e)
            if not isinstance(e, expected):
                failures.append(f"{name}: {type(e).__name__} is not {expected.__name__}: {msg}")
            elif missing := [w for w in words if w not in msg]:
                failures.append(f"{name}: message lacks {missing}: {msg}")
            elif len(msg) > 400:
                failures.append(f"{name}: message of {len(msg)} characters")
        else:
            failures.append(f"{name}: no exception")
    assert not failures, "\n".join(failures)
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and engine.pool_stats().used == 0
    greedy = SP(temperature=0.0, max_tokens=4, ignore_eos=True)
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}], greedy, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4]
    final = _async(allm, "Hello", greedy, "good")[-1]
    assert final.outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert engine.pool_stats().used == 0


def test_grammar_failing_mid_generation_ends_with_error(apis):
    """Compiled in process (no sandbox probe), ``(a{1000}){1000}``'s lexer fails on the
    first tokens: the request ends with finish_reason 'error', the matcher's message
    as stop_reason, and its pages are freed."""
    llm = apis[0]
    engine = llm.llm_engine
    assert engine.grammars.sandbox is None
    sp = SP(temperature=0.0, max_tokens=16,
            structured_outputs=StructuredOutputsParams(regex="(a{1000}){1000}"))
    out = llm.generate("Say a", sp, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "error", out
    assert str(out.stop_reason).startswith("structured output failed: ") and "lexer" in \
        out.stop_reason and "\n" not in out.stop_reason
    assert engine.pool_stats().used == 0 and not engine.has_unfinished_requests()


def test_allowed_ids_conflicting_with_the_grammar(apis):
    """allowed_token_ids and a grammar with no common first token: ValueError at the
    call, naming the token the grammar wants, nothing queued. With no common token
    later, the sequence ends with finish_reason 'error', a stop_reason that says so,
    without the token sampled from the empty mask, and its pages freed."""
    llm = apis[0]
    engine = llm.llm_engine
    ids = llm.get_tokenizer().encode("Hello, world", add_special_tokens=False)
    regex = StructuredOutputsParams(regex="Hello, world")
    with pytest.raises(ValueError, match=f"admit no common token for the first output token.*"
                                         f"ids {ids[0]}\\)"):
        llm.generate("Say", SP(temperature=0.0, max_tokens=8, allowed_token_ids=ids[1:2],
                               structured_outputs=regex), use_tqdm=False)
    assert not engine.has_unfinished_requests()
    out = llm.generate("Say", SP(temperature=0.0, max_tokens=8, allowed_token_ids=ids[:1],
                                 structured_outputs=regex), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "error" and out.token_ids == ids[:1], out
    assert out.stop_reason.startswith("allowed_token_ids and the structured output admit no "
                                      f"common token after 1 output token: ") and \
        f"ids {ids[1]})" in out.stop_reason, out
    assert engine.pool_stats().used == 0 and not engine.has_unfinished_requests()
    # With both ids allowed the grammar is met.
    out = llm.generate("Say", SP(temperature=0.0, max_tokens=8, allowed_token_ids=ids,
                                 structured_outputs=regex), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids and out.finish_reason == "stop", out
