"""The byte-table detokenizer against transformers' decode and the general path."""

import random

import pytest

from pagedjax.engine.byte_detokenizer import ByteDetokenizer, byte_table
from pagedjax.engine.detokenizer import IncrementalDetokenizer, rust_backend
from pagedjax.engine.output_processor import OutputProcessor
from pagedjax.sampling_params import SamplingParams

from tests.engine.test_tokenizer import TEXTS


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def tables(tok):
    out = {skip: byte_table(rust_backend(tok), skip) for skip in (True, False)}
    assert out[True] is not None and out[False] is not None  # SmolLM2 is byte-level BPE
    return out


def _stream(d, ids, chunk):
    out = [d.add(ids[i]) if chunk == 1 else d.add(ids[i:i + chunk])
           for i in range(0, len(ids), chunk)]
    return out, "".join(out) + d.flush()


@pytest.mark.parametrize("chunk", [1, 3])
def test_matches_decode_and_general_path(tok, tables, chunk):
    prompt = tok.encode("Say something:", add_special_tokens=False)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        fast = ByteDetokenizer.create(tables[True], prompt)
        deltas, got = _stream(fast, ids, chunk)
        _, want = _stream(IncrementalDetokenizer(tok, prompt), ids, chunk)
        assert got == want == tok.decode(ids), text
        # Text is streamed as soon as its characters are whole (a token's complete
        # characters before a split one, where the general path waits for both).
        assert not any("\ufffd" in x for x in deltas), text


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_invalid_utf8_and_special_tokens(tok, tables, skip):
    """Random ids split characters and make invalid UTF-8 (U+FFFD); special tokens are
    skipped or kept: the stream still concatenates to transformers' decode."""
    rng = random.Random(0)
    vocab = len(tables[skip].bytes)
    specials = [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_start|>")]
    # Ids whose bytes are not whole characters (lead or continuation bytes).
    partial = [i for i, t in enumerate(tables[skip].texts) if t is None]
    assert len(partial) > 50
    for _ in range(200):
        ids = [rng.choice(partial) if rng.random() < 0.4 else
               rng.choice(specials) if rng.random() < 0.1 else rng.randrange(vocab)
               for _ in range(rng.randrange(1, 30))]
        d = ByteDetokenizer.create(tables[skip], [])
        _, got = _stream(d, ids, 1)
        assert got == tok.decode(ids, skip_special_tokens=skip), ids


def test_split_character_is_held_back(tok, tables):
    ids = tok.encode(" 😀", add_special_tokens=False)
    assert len(ids) > 1
    d = ByteDetokenizer.create(tables[True], [])
    # The space is whole at once; the emoji's bytes wait for the token that ends it.
    assert [d.add(i) for i in ids] == [" "] + [""] * (len(ids) - 2) + ["😀"]


def test_out_of_vocabulary_id_is_an_error(tables):
    d = ByteDetokenizer.create(tables[True], [])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        d.add(len(tables[True].bytes) + 5)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        d.add(-1)


def test_prompt_ending_inside_a_character_keeps_the_general_path(tok, tables):
    ids = tok.encode(" 😀", add_special_tokens=False)
    assert ByteDetokenizer.create(tables[True], ids[:1]) is None
    proc = OutputProcessor(tok)
    proc.add_request("a", None, ids[:1], SamplingParams(max_tokens=4), 0.0)
    proc.add_request("b", None, ids, SamplingParams(max_tokens=4), 0.0)
    assert isinstance(proc._states["a"].seqs[0].detok, IncrementalDetokenizer)
    assert isinstance(proc._states["b"].seqs[0].detok, ByteDetokenizer)


def test_other_tokenizers_get_no_table():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({"▁a": 0, "▁b": 1, "<unk>": 2}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Metaspace()  # SentencePiece-style: not byte-level
    assert byte_table(t, True) is None
    t.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    assert byte_table(t, True) is None  # more than ByteLevel alone
    assert byte_table(None, True) is None
