"""Reasoning parsers: qwen3 and deepseek_r1 split thinking from content the same
way whole and fed in pieces cut at random points; the prompt decides where the
output starts."""

from __future__ import annotations

import random
import zlib

import pytest

from pagedjax.entrypoints.reasoning import (REASONING_PARSERS, Qwen3ReasoningParser,
                                            get_reasoning_parser)
from pagedjax.entrypoints.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser

CASES = [
    # (parser, prompt, output, reasoning, content)
    ("qwen3", "", "<think>\nLet me see: 2 < 3.\n</think>\n\nYes.", "\nLet me see: 2 < 3.\n",
     "\n\nYes."),
    ("qwen3", "", "\n<think>a</think>b", "a", "b"),
    ("qwen3", "", "No thinking here </think> at all", None, "No thinking here </think> at all"),
    ("qwen3", "<think>\n\n</think>\n\n", "Plain answer.", None, "Plain answer."),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "open</think>done", "open", "done"),
    ("qwen3", "", "<think>cut before the end", "cut before the end", None),
    ("qwen3", "", "<thin", None, "<thin"),
    ("deepseek_r1", "<think>\n", "Hmm, 1+1.\n</think>\n\n2", "Hmm, 1+1.\n", "\n\n2"),
    ("deepseek_r1", "", "<think>x</think>y", "x", "y"),
    ("deepseek_r1", "", "all thinking, cut", "all thinking, cut", None),
    ("deepseek_r1", "<think>\n\n</think>\n\n", "content only", None, "content only"),
    ("deepseek_r1", "", "</think>", "", None),
]


def _pieces(parser, text: str, rng: random.Random) -> tuple[str, str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6)))) \
        if len(text) > 1 else []
    r = c = ""
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        dr, dc = parser.feed(text[a:b])
        r, c = r + dr, c + dc
    dr, dc = parser.finish()
    return r + dr, c + dc


@pytest.mark.parametrize("name,prompt,text,reasoning,content", CASES)
def test_split_whole_and_in_random_pieces(name, prompt, text, reasoning, content):
    cls = get_reasoning_parser(name)
    assert cls.for_prompt(prompt).split(text) == (reasoning, content)
    rng = random.Random(zlib.crc32(text.encode()))
    for _ in range(25):
        r, c = _pieces(cls.for_prompt(prompt), text, rng)
        assert (r, c) == (reasoning or "", content or "")


def test_pieces_one_character_at_a_time():
    text = "<think>" + "thought with < and </thin and </ inside" + "</think>answer <think>"
    p = Qwen3ReasoningParser()
    out = [p.feed(ch) for ch in text] + [p.finish()]
    assert "".join(r for r, _ in out) == "thought with < and </thin and </ inside"
    assert "".join(c for _, c in out) == "answer <think>"
    assert p.ended and p.entered
    # nothing of a tag is ever given out as text while it could still be one
    assert all("<think" not in r and "</think" not in r for r, _ in out)


def test_registry_and_defaults():
    assert set(REASONING_PARSERS) >= {"qwen3", "deepseek_r1"}
    with pytest.raises(ValueError, match="deepseek_r1"):
        get_reasoning_parser("nope")
    assert DeepSeekR1ReasoningParser().in_reasoning and not Qwen3ReasoningParser().in_reasoning
    assert Qwen3ReasoningParser.for_prompt("x<think>\n").in_reasoning
