"""vLLM's /tokenize and /detokenize against transformers' own tokenizer of the same
GGUF file (AutoTokenizer.from_pretrained(gguf_file=...), built by code nobody
here wrote), and /v1/models' max_model_len."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils.server import SERVER_ARGS

pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is", "  leading spaces\tand tabs\n\nnew lines",
         "naïve café — 日本語 🐍 emoji", "def f(x):\n    return x ** 2\n", "<|im_start|>user"]
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello! ¿Qué tal?"},
        {"role": "assistant", "content": "Fine."},
        {"role": "user", "content": [{"type": "text", "text": "And "},
                                     {"type": "text", "text": "you?"}]}]


@pytest.fixture(scope="module")
def ref(smollm2_gguf):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    p = Path(smollm2_gguf)
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def _ids(x):
    return list(x["input_ids"] if hasattr(x, "keys") else x)


def test_tokenize_prompt_matches_transformers(server, ref):
    for text in TEXTS:
        for special in (None, True, False):
            body = {"prompt": text, "model": server.model}
            if special is not None:
                body["add_special_tokens"] = special
            status, r = server.raw("POST", "/tokenize", body)
            assert status == 200, r
            want = ref.encode(text, add_special_tokens=special is not False)
            assert r["tokens"] == want and r["count"] == len(want)
            assert r["max_model_len"] == SERVER_ARGS["max_model_len"]
    status, r = server.raw("POST", "/tokenize", {"prompt": TEXTS[2], "return_token_strs": True})
    assert r["token_strs"] == ref.convert_ids_to_tokens(r["tokens"])


def test_tokenize_messages_matches_chat_template(server, ref):
    plain = [dict(m, content="And you?") if isinstance(m["content"], list) else m for m in CHAT]
    for gen in (True, False):
        status, r = server.raw("POST", "/tokenize", {"messages": CHAT,
                                                     "add_generation_prompt": gen})
        assert status == 200, r
        want = _ids(ref.apply_chat_template(plain, add_generation_prompt=gen, tokenize=True))
        assert r["tokens"] == want and r["count"] == len(want)
    # The same ids a chat completion's prompt has.
    chat = server.client().chat.completions.create(model=server.model, messages=plain,
                                                   max_tokens=1)
    assert chat.usage.prompt_tokens == server.raw("POST", "/tokenize",
                                                  {"messages": plain})[1]["count"]


def test_detokenize_round_trip(server, ref):
    for text in TEXTS:
        ids = server.raw("POST", "/tokenize", {"prompt": text})[1]["tokens"]
        status, r = server.raw("POST", "/detokenize", {"tokens": ids, "model": server.model})
        assert status == 200, r
        assert r["prompt"] == ref.decode(ids)
        assert r["prompt"].endswith(text)  # no BOS is added for SmolLM2: the text itself
    chat_ids = server.raw("POST", "/tokenize", {"messages": CHAT[:2]})[1]["tokens"]
    assert server.raw("POST", "/detokenize", {"tokens": chat_ids})[1]["prompt"] == \
        ref.decode(chat_ids)
    assert server.raw("POST", "/detokenize", {"tokens": []}) == (200, {"prompt": ""})


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400,
     "messages"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}],
                   "chat_template": "{% for %}"}, 400, "chat_template"),
    ("/tokenize", {"prompt": "a", "model": "nope"}, 404, "model"),
    ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": ["a"]}, 400, "tokens"),
    ("/detokenize", {}, 400, "tokens"),
])
def test_bad_input_is_4xx(server, path, body, status, param):
    got, r = server.raw("POST", path, body)
    assert got == status, r
    assert r["error"]["param"] == param and r["error"]["message"]


def test_key_required_and_models_carry_max_model_len(server):
    assert server.raw("POST", "/tokenize", {"prompt": "a"}, auth=False)[0] == 401
    assert server.raw("POST", "/detokenize", {"tokens": [1]}, auth=False)[0] == 401
    status, r = server.raw("GET", "/v1/models")
    assert status == 200
    assert r["data"][0]["max_model_len"] == SERVER_ARGS["max_model_len"]
    assert server.client().models.list().data[0].max_model_len == SERVER_ARGS["max_model_len"]
