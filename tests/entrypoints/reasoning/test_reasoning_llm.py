"""LLM.chat with a reasoning parser on a tiny scripted Qwen3 (tests/utils/reasoning_model):
the thinking and the answer come apart, chat_template_kwargs reach the template,
and a JSON schema constrains only what follows the reasoning."""

from __future__ import annotations

import json

import pytest

from pagedjax import SamplingParams, StructuredOutputsParams
from tests.utils.reasoning_model import ANSWER, THOUGHT, build_reasoning_model

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer"],
          "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from pagedjax import LLM

    path = build_reasoning_model(str(tmp_path_factory.mktemp("reasoning_qwen3")))
    return LLM(path, max_model_len=128, max_num_seqs=4, num_pages=64)


def _greedy(**kw):
    return SamplingParams(temperature=0.0, max_tokens=40, **kw)


def test_chat_splits_thinking(llm):
    (out,) = llm.chat(HI, _greedy(), use_tqdm=False, reasoning_parser="qwen3")
    o = out.outputs[0]
    assert (o.reasoning_content, o.text) == (THOUGHT, ANSWER)
    (r1,) = llm.chat(HI, _greedy(), use_tqdm=False, reasoning_parser="deepseek_r1")
    assert (r1.outputs[0].reasoning_content, r1.outputs[0].text) == (THOUGHT, ANSWER)
    (plain,) = llm.chat(HI, _greedy(), use_tqdm=False)
    assert plain.outputs[0].text == f"<think>{THOUGHT}</think>{ANSWER}"
    assert plain.outputs[0].reasoning_content is None


def test_chat_template_kwargs_turn_thinking_off(llm):
    for parser in ("qwen3", "deepseek_r1"):
        (out,) = llm.chat(HI, _greedy(), use_tqdm=False, reasoning_parser=parser,
                          chat_template_kwargs={"enable_thinking": False})
        assert llm.get_tokenizer().decode(out.prompt_token_ids).endswith("</think>")
        assert (out.outputs[0].reasoning_content, out.outputs[0].text) == (None, ANSWER)


def test_schema_constrains_only_the_answer(llm):
    import jsonschema

    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    (out,) = llm.chat(HI, _greedy(structured_outputs=so), use_tqdm=False,
                      reasoning_parser="qwen3")
    o = out.outputs[0]
    assert o.reasoning_content == THOUGHT  # the thinking was free
    jsonschema.validate(json.loads(o.text), SCHEMA)
    assert o.finish_reason == "stop"
    # without the parser the schema holds from the first token: no thinking at all
    (bare,) = llm.chat(HI, _greedy(structured_outputs=so), use_tqdm=False)
    jsonschema.validate(json.loads(bare.outputs[0].text), SCHEMA)
    # thinking off: the prompt closed the block, so the answer is constrained at once
    (off,) = llm.chat(HI, _greedy(structured_outputs=so), use_tqdm=False,
                      reasoning_parser="qwen3", chat_template_kwargs={"enable_thinking": False})
    assert off.outputs[0].reasoning_content is None
    jsonschema.validate(json.loads(off.outputs[0].text), SCHEMA)


def test_start_after_must_be_token_ids():
    with pytest.raises(ValueError, match="start_after"):
        StructuredOutputsParams(json=SCHEMA, start_after=[])
    with pytest.raises(ValueError, match="start_after"):
        StructuredOutputsParams(json=SCHEMA, start_after=["</think>"])
