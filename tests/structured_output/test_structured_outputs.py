"""Structured outputs (StructuredOutputsParams) on the real default model.

The checks use software nobody here wrote: ``jsonschema`` validates every JSON
output against its schema, ``re.fullmatch`` checks regex outputs. One mixed
batch (JSON schemas with nested objects, arrays, enums and required fields;
regexes; choices; n=2; a stop string; sampled and greedy; unconstrained
neighbours) runs on a small pool (preemption, chunked prefill) once with
overlapped steps and once without: outputs identical, all valid, no page held.
"""

from __future__ import annotations

import json
import re

import pytest

from pagedjax import LLM, SamplingParams, StructuredOutputsParams
from pagedjax.distributed.multihost import (  # noqa: F401 (roundtrip)
    _params_from_json,
    _params_to_json,
)

jsonschema = pytest.importorskip("jsonschema")

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
NESTED = {"type": "object", "additionalProperties": False, "required": ["address", "tags"],
          "properties": {
              "address": {"type": "object", "additionalProperties": False,
                          "required": ["city", "zip"],
                          "properties": {"city": {"type": "string", "maxLength": 16},
                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
              "tags": {"type": "array", "minItems": 1, "maxItems": 3,
                       "items": {"type": "string", "enum": ["home", "work", "other"]}}}}
ENUM = {"type": "object", "additionalProperties": False, "required": ["color", "count"],
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "count": {"type": "integer", "minimum": 1, "maximum": 9}}}
ITEMS = {"type": "array", "minItems": 1, "maxItems": 3,
         "items": {"type": "object", "additionalProperties": False, "required": ["id", "ok"],
                   "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                  "ok": {"type": "boolean"}}}}

S = StructuredOutputsParams


def _chat(tok, question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)


def _workload(tok):
    """(request id, prompt, params, check) — check(text) validates a finished output."""
    def js(schema):
        return lambda t: jsonschema.validate(json.loads(t), schema)

    def rx(pattern):
        return lambda t: re.fullmatch(pattern, t) is not None or pytest.fail(f"{t!r} !~ {pattern}")

    def ch(options):
        return lambda t: t in options or pytest.fail(f"{t!r} not in {options}")

    greedy = dict(temperature=0.0)
    hot = dict(temperature=0.8, top_p=0.95)
    w = []
    for i, (q, schema) in enumerate([
            ("Describe a person as JSON.", PERSON), ("Give an address as JSON.", NESTED),
            ("Pick a color and a count as JSON.", ENUM), ("List items as JSON.", ITEMS),
            ("Describe your best friend as JSON.", PERSON), ("Where do you live? JSON.", NESTED)]):
        kw = greedy if i % 2 == 0 else dict(hot, seed=100 + i)
        spec = S(json=schema, disable_any_whitespace=i >= 3)
        w.append((f"json{i}", _chat(tok, q), SamplingParams(
            max_tokens=120, structured_outputs=spec, **kw), js(schema)))
    w.append(("json_str", _chat(tok, "A color as JSON."), SamplingParams(
        max_tokens=120, structured_outputs=S(json=json.dumps(ENUM)), **greedy), js(ENUM)))
    w.append(("json_obj", _chat(tok, "Return a JSON object with your name."),
              SamplingParams(max_tokens=120, structured_outputs=S(json_object=True), **greedy),
              js({"type": "object"})))
    for i, (q, pattern) in enumerate([
            ("Give a phone number.", r"\d{3}-\d{4}"), ("Name an animal.", r"(cat|dog|bird)s?"),
            ("Give an email address.", r"[a-z]{2,10}@[a-z]{2,10}\.(com|org)"),
            ("Name a city.", r"[A-Z][a-z]{2,9}")]):
        kw = greedy if i % 2 == 0 else dict(hot, seed=200 + i)
        w.append((f"regex{i}", _chat(tok, q), SamplingParams(
            max_tokens=40, structured_outputs=S(regex=pattern), **kw), rx(pattern)))
    for i, (q, options) in enumerate([
            ("Is the sky blue?", ["yes", "no"]),
            ("What is the capital of France?", ["Paris", "London", "Berlin"]),
            ("Pick a primary color.", ["red", "green", "blue"])]):
        kw = greedy if i % 2 == 0 else dict(hot, seed=300 + i)
        w.append((f"choice{i}", _chat(tok, q), SamplingParams(
            max_tokens=10, structured_outputs=S(choice=options), **kw), ch(options)))
    # n=2 (each sample its own matcher), seeded.
    w.append(("n2", _chat(tok, "Describe a person as JSON."), SamplingParams(
        n=2, temperature=1.0, seed=5, max_tokens=120, structured_outputs=S(json=PERSON)),
        js(PERSON)))
    # Unconstrained neighbours, greedy.
    w.append(("free0", "The capital of France is", SamplingParams(temperature=0.0,
                                                                  max_tokens=24), None))
    w.append(("free1", _chat(tok, "Describe a person."), SamplingParams(temperature=0.0,
                                                                        max_tokens=32), None))
    # A stop string ends the request before the grammar completes.
    w.append(("stopped", _chat(tok, "Describe a person as JSON."), SamplingParams(
        temperature=0.0, max_tokens=120, stop=['"age"'], structured_outputs=S(json=PERSON)),
        None))
    return w


def _run(async_scheduling: bool):
    llm = LLM(max_model_len=512, num_pages=22, max_num_seqs=8, max_num_batched_tokens=64,
              page_size=16, async_scheduling=async_scheduling)
    engine = llm.llm_engine
    work = _workload(llm.get_tokenizer())
    for rid, prompt, params, _ in work:
        engine.add_request(rid, prompt, params)
    finished, preemptions = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        preemptions = max(preemptions, sum(r.num_preemptions
                                           for r in engine.scheduler.requests.values()))
    # Constrained rows overlap too: the model of step N runs while step N-1's tokens
    # reach the matchers; only the sampler waits for the masks.
    assert (engine.core.num_overlapped_steps > 0) == async_scheduling
    return llm, work, finished, preemptions


@pytest.fixture(scope="module")
def runs():
    return _run(True), _run(False)


def _summary(out):
    return [(c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]


@pytest.mark.slow
def test_mixed_batch_is_valid_and_overlap_does_not_change_it(runs):
    (llm_on, work, on, preempt_on), (llm_off, _, off, preempt_off) = runs
    assert preempt_on > 0 and preempt_off > 0, "the pool is meant to preempt"
    assert set(on) == set(off) == {w[0] for w in work}
    for rid in on:
        assert _summary(on[rid]) == _summary(off[rid]), f"request {rid} differs"
    n_checked = 0
    for rid, _, params, check in work:
        for c in on[rid].outputs:
            if check is not None:
                assert c.finish_reason == "stop", (rid, c.text, c.finish_reason)
                check(c.text)
                n_checked += 1
    assert n_checked >= 17
    assert len(on["n2"].outputs) == 2
    stopped = on["stopped"].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == '"age"'
    for llm in (llm_on, llm_off):
        stats = llm.llm_engine.pool_stats()
        assert stats.used == 0 and stats.total_refs == 0, stats


@pytest.mark.slow
def test_unconstrained_neighbour_matches_its_solo_run(runs):
    """A constrained and an unconstrained greedy request in the same steps: the
    unconstrained one gives its solo output token for token."""
    llm = runs[0][0]
    tok = llm.get_tokenizer()
    free = SamplingParams(temperature=0.0, max_tokens=24)
    prompt = _chat(tok, "Name three fruits.")
    solo = llm.generate([prompt], free, use_tqdm=False)[0].outputs[0].token_ids
    pair = llm.generate([prompt, _chat(tok, "Describe a person as JSON.")],
                        [free, SamplingParams(temperature=0.0, max_tokens=60,
                                              structured_outputs=S(json=PERSON))],
                        use_tqdm=False)
    assert pair[0].outputs[0].token_ids == solo
    jsonschema.validate(json.loads(pair[1].outputs[0].text), PERSON)


@pytest.mark.slow
def test_invalid_specs_raise_at_add_and_hold_nothing(runs):
    engine = runs[1][0].llm_engine
    bad = [S(json={"type": "objectx"}), S(json="{not json"), S(regex="(unclosed"),
           S(grammar="start: missing_rule"), S(json={"$ref": "#/nowhere"})]
    for spec in bad:
        with pytest.raises(ValueError, match="structured_outputs"):
            engine.add_request("bad", "Hello", SamplingParams(structured_outputs=spec))
        assert not engine.has_unfinished_requests()
    assert engine.pool_stats().used == 0
    # Compiles are cached: the same schema twice is one compile.
    info0 = engine.grammars.cache_info()
    for _ in range(2):
        engine.compile_grammar(SamplingParams(structured_outputs=S(json={"type": "integer"})))
    info1 = engine.grammars.cache_info()
    assert info1["misses"] == info0["misses"] + 1 and info1["hits"] == info0["hits"] + 1
    # A grammar (Lark) works end to end.
    out = runs[1][0].generate(["Say yes or no:"], SamplingParams(
        temperature=0.0, max_tokens=8, structured_outputs=S(grammar='start: "yes" | "no"')),
        use_tqdm=False)[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_params_validation_and_json_roundtrip():
    with pytest.raises(ValueError, match="exactly one"):
        S()
    with pytest.raises(ValueError, match="exactly one"):
        S(json={"type": "object"}, regex="a+")
    with pytest.raises(ValueError, match="choice"):
        S(choice="yes")
    with pytest.raises(ValueError, match="choice"):
        S(choice=[])
    with pytest.raises(ValueError, match="regex"):
        S(regex="")
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs="json")
    assert S(json_object=True).kind == "json_object" and S(choice=["a"]).kind == "choice"
    p = SamplingParams(structured_outputs=S(json=PERSON, disable_any_whitespace=True))
    back = _params_from_json(json.loads(json.dumps(_params_to_json(p))))
    assert back.structured_outputs == p.structured_outputs


@pytest.mark.slow
def test_with_speculative_decoding_constraints_hold():
    """n-gram speculation on: constrained rows get no proposals (their mask needs each
    token) but still share verification steps with rows that do; outputs stay valid
    and an unconstrained greedy row gives its plain-engine tokens."""
    llm = LLM(max_model_len=256, num_pages=64, max_num_seqs=4, page_size=16,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    tok = llm.get_tokenizer()
    free = SamplingParams(temperature=0.0, max_tokens=40)
    prompts = [_chat(tok, "Repeat after me: one two three, one two three, one two three."),
               _chat(tok, "Describe a person as JSON."), _chat(tok, "Is the sky blue?")]
    outs = llm.generate(prompts, [
        free, SamplingParams(temperature=0.0, max_tokens=100, structured_outputs=S(json=PERSON)),
        SamplingParams(temperature=0.0, max_tokens=5, structured_outputs=S(choice=["yes", "no"]))],
        use_tqdm=False)
    jsonschema.validate(json.loads(outs[1].outputs[0].text), PERSON)
    assert outs[2].outputs[0].text in ("yes", "no")
    assert llm.llm_engine.spec_decode_stats()["num_draft_tokens"] > 0
    assert llm.llm_engine.pool_stats().used == 0
