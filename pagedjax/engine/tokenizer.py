"""Tokenizers (HF folder or GGUF file), incremental detokenization, stop strings.

``IncrementalDetokenizer`` turns generated token ids into text deltas. It keeps
two offsets into the token list: text is decoded from ``prefix_offset`` (a few
tokens of context, so BPE/SentencePiece leading spaces come out right) and the
new text is what lies past the decode of ``[prefix_offset, read_offset)``. A
decode that ends in U+FFFD (a multi-byte character split across tokens) is
held back until the character completes.

``StopChecker`` watches the growing output text for stop strings, which may
span deltas, truncates at the first one, and tells a streamer how many
characters are safe to send (a tail that could still become a stop string is
held back).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

# The text side of generation (incremental detokenizer, stop strings) lives in
# detokenizer.py; its names are re-exported here, where callers have always found them.
from pagedjax.engine.byte_detokenizer import bytes_to_unicode
from pagedjax.engine.detokenizer import (  # noqa: F401
    INITIAL_PREFIX_TOKENS,
    IncrementalDetokenizer,
    StopChecker,
)

# Tokens of context decoded before the first new token (vLLM uses 5 too).


def _cache_root() -> Path:
    return Path(os.environ.get("PAGEDJAX_CACHE", Path.home() / ".cache" / "pagedjax")) / "tokenizers"


# Bump when the GGUF -> tokenizer build changes, so older caches are not reused.
_GGUF_BUILD_VERSION = 2


def _gguf_cache_dir(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}:{st.st_size}:{st.st_mtime_ns}:v{_GGUF_BUILD_VERSION}"
    tag = hashlib.sha256(key.encode()).hexdigest()
    return _cache_root() / f"{gguf_path.stem}-{tag[:12]}"


class _NoTorchNotice(logging.Filter):
    """Drops transformers' import-time "PyTorch was not found" notice: it is about
    transformers' own PyTorch models, which pagedjax never uses (we only need its
    tokenizers), and it alarms a newcomer on the first run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "PyTorch was not found" not in record.getMessage()


def _quiet_transformers_import() -> None:
    if "transformers" not in sys.modules:
        logger = logging.getLogger("transformers")
        if not any(isinstance(f, _NoTorchNotice) for f in logger.filters):
            logger.addFilter(_NoTorchNotice())


def load_tokenizer(path_or_dir: Union[str, os.PathLike], gguf_file: Optional[str] = None,
                   trust_remote_code: bool = False):
    """A fast transformers tokenizer from an HF folder / hub name or a GGUF file.

    ``path_or_dir`` may be a folder (with ``gguf_file`` naming a file in it) or
    the path of a ``.gguf`` file. A GGUF tokenizer is built from the file's
    metadata by :func:`tokenizer_from_gguf` (no torch needed) and cached under
    ``~/.cache/pagedjax/tokenizers/`` (``$PAGEDJAX_CACHE``); the cache key
    includes the file's size and mtime.
    """
    _quiet_transformers_import()
    path = Path(path_or_dir)
    if gguf_file is None and path.suffix == ".gguf" and path.is_file():
        path, gguf_file = path.parent, path.name
    if gguf_file is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path_or_dir), trust_remote_code=trust_remote_code)
    else:
        gguf_path = path / gguf_file
        if not gguf_path.is_file():
            raise ValueError(f"GGUF file not found: {gguf_path}")
        cache = _gguf_cache_dir(gguf_path)
        if (cache / "tokenizer_config.json").is_file():
            # What tokenizer_from_gguf built and saved: a PreTrainedTokenizerFast,
            # loaded without AutoTokenizer's model-config machinery (which imports
            # torch: seconds of a warm start).
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(str(cache))
        else:
            tok = tokenizer_from_gguf(gguf_path)
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=cache.parent))
            try:
                tok.save_pretrained(str(tmp))
                os.replace(tmp, cache)
            except OSError:  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{path_or_dir}: only fast (Rust `tokenizers`) tokenizers are supported.")
    return tok


def load_tokenizer_in_background(path_or_dir: Union[str, os.PathLike], **kwargs):
    """:func:`load_tokenizer` on a daemon thread, started now: the engine loads
    the model meanwhile (importing transformers and reading the tokenizer is
    Python work; the weights' reading and placing mostly runs outside the GIL).
    Returns a future: ``.result()`` is the tokenizer, or raises what loading it
    raised."""
    from concurrent.futures import Future
    import threading

    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(load_tokenizer(path_or_dir, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits for it
            future.set_exception(e)

    threading.Thread(target=run, name="pagedjax-tokenizer", daemon=True).start()
    return future


# ----------------------------------------------------------------------------- GGUF
#
# A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary, merges,
# token types and special ids as metadata. transformers can rebuild a tokenizer
# from them (AutoTokenizer.from_pretrained(..., gguf_file=...)), but its GGUF
# reader imports torch, which pagedjax does not depend on. So we read the
# metadata ourselves and assemble the same `tokenizers` pipeline transformers
# does (tests compare the two token for token):
#
# * "gpt2" (byte-level BPE: SmolLM2, Llama 3, Qwen2, ...): BPE over the byte
#   alphabet, ByteLevel pre-tokenizer (or a Split with the regex named by
#   tokenizer.ggml.pre, then ByteLevel) and ByteLevel decoder;
# * "llama" (SentencePiece BPE: Llama 2, Mistral, Gemma, ...): BPE with byte
#   fallback, merges from the file or re-derived from the scores; Gemma spells
#   spaces as U+2581 in a normalizer, the others prepend it with Metaspace.
#
# Token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte.

_CONTROL, _USER_DEFINED = 3, 4
_SPIECE = "\u2581"

# Pre-tokenizer regexes by tokenizer.ggml.pre (llama.cpp's names), as
# transformers maps them; any other value keeps GPT-2's ByteLevel regex.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN_SPLIT = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O_SPLIT = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}"
                rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}
_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")


def read_gguf_metadata(path: Union[str, os.PathLike]) -> dict:
    """The key/value metadata of a GGUF file (v2/v3, little-endian), as Python
    values (``pagedjax.models.gguf_file``; the header is parsed once per file
    and process, shared with the model's loading)."""
    from pagedjax.models.loader import gguf_reader

    return dict(gguf_reader(str(path)).metadata)


def _derive_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a vocabulary without a merge list (SentencePiece):
    every split of a token into two vocabulary pieces, best score first (ties:
    longer left piece, then longer right piece, then file order), which is the
    order transformers' ``generate_merges`` produces."""
    get = vocab.get
    ranked = []
    for token, score in scores.items():
        found = []
        for i in range(1, len(token)):
            left = get(token[:i])
            if left is not None:
                right = get(token[i:])
                if right is not None:
                    found.append((left, right, i))
        found.sort()  # within a token: by the pieces' ids
        n = len(token)
        for _, _, i in found:
            ranked.append((-score, -i, i - n, len(ranked), token, i))
    ranked.sort()  # ascending on negated keys == a stable sort on the keys, descending
    return [(token[:i], token[i:]) for *_, token, i in ranked]


def _file_merges(meta: dict) -> Optional[list[tuple[str, str]]]:
    merges = meta.get("tokenizer.ggml.merges")
    return None if merges is None else [tuple(m.split(" ", 1)) for m in merges]


def _build_backend(meta: dict):
    """The `tokenizers.Tokenizer` (model, normalizer, pre-tokenizer, decoder and
    added tokens; no post-processor) that GGUF metadata describes, plus the
    vocabulary it was built on."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    kind = meta.get("tokenizer.ggml.model")
    arch = meta.get("general.architecture")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = meta.get("tokenizer.ggml.token_type") or []
    if kind == "gpt2":
        byte_chars = bytes_to_unicode()
        alphabet = set(byte_chars.values())
        # Tokens are stored in the byte alphabet; respell any that are not.
        vocab = {(t if set(t) <= alphabet else "".join(byte_chars[b] for b in t.encode())): i
                 for i, t in enumerate(tokens)}
        merges = _file_merges(meta)
        if merges is None:
            merges = _derive_merges(vocab, dict(zip(tokens, meta["tokenizer.ggml.scores"])))
        tk = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                           end_of_word_suffix="", fuse_unk=False))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        class_defaults = ["<|endoftext|>"]
        control_ok = lambda t: set(t) <= alphabet  # noqa: E731 - other spellings are mislabels
    elif kind == "llama" and arch in _GEMMA_ARCHS:
        # Runs of spaces are stored as real spaces; the normalizer turns them into U+2581.
        spelled = [_SPIECE * len(t) if " " in t and not t.strip() else t for t in tokens]
        vocab = {t: i for i, t in enumerate(spelled)}
        # Gemma's merges follow file order, not the scores.
        merges = _file_merges(meta)
        if merges is None:
            merges = _derive_merges(vocab, {t: -i for i, t in enumerate(spelled)})
        tk = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token="<unk>",
                           dropout=None, byte_fallback=True))
        tk.normalizer = normalizers.Replace(" ", _SPIECE)
        tk.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                                invert=False)
        tk.decoder = decoders.Sequence([decoders.Replace(_SPIECE, " "), decoders.ByteFallback(),
                                        decoders.Fuse()])
        class_defaults = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
        control_ok = lambda t: True  # noqa: E731
    elif kind == "llama":
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = _file_merges(meta)
        if merges is None:
            merges = _derive_merges(vocab, dict(zip(tokens, meta["tokenizer.ggml.scores"])))
        tk = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                           dropout=None))
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPIECE, prepend_scheme="first",
                                                    split=False)
        tk.decoder = decoders.Sequence([decoders.Replace(_SPIECE, " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(content=" ", left=1)])
        class_defaults = ["<unk>", "<s>", "</s>"]
        control_ok = lambda t: True  # noqa: E731
    else:
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (supported: 'gpt2', 'llama')")

    split = _PRE_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is not None:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    # Matched whole in the text: the usual special tokens of this tokenizer
    # family (when the vocabulary has them) and the control tokens as special
    # tokens, user-defined ones (e.g. "<think>") as plain added tokens.
    special = [t for t in class_defaults if t in vocab]
    special += [t for t, ty in zip(tokens, types) if ty == _CONTROL and control_ok(t)]
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(special)])
    tk.add_tokens([AddedToken(t, normalized=False, special=False)
                   for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab])
    return tk


def tokenizer_from_gguf(gguf_path: Union[str, os.PathLike]):
    """A ``PreTrainedTokenizerFast`` built from a GGUF file's metadata.

    Needs only ``tokenizers`` and ``transformers`` (not torch, not the ``gguf``
    package). Encodes and decodes like transformers' own GGUF tokenizer.
    """
    from tokenizers import processors
    _quiet_transformers_import()
    from transformers import PreTrainedTokenizerFast

    meta = read_gguf_metadata(gguf_path)
    if "tokenizer.ggml.tokens" not in meta:
        raise ValueError(f"{gguf_path}: the GGUF has no tokenizer metadata")
    tk = _build_backend(meta)
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos, eos = token("bos_token_id"), token("eos_token_id")
    bos_id = tk.token_to_id(bos) if bos is not None else None
    eos_id = tk.token_to_id(eos) if eos is not None else None
    kind = meta.get("tokenizer.ggml.model")
    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")) and bos_id is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos_id is not None
    # The template transformers' update_post_processor writes for these flags
    # (set here too for transformers versions that do not rebuild it).
    single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
    pair = " ".join([single] + [f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
    specials = [(bos, bos_id)] * add_bos + [(eos, eos_id)] * add_eos
    tk.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                      special_tokens=specials)
    kwargs = {"bos_token": bos, "eos_token": eos, "unk_token": token("unknown_token_id"),
              "pad_token": token("padding_token_id"), "add_bos_token": add_bos,
              "add_eos_token": add_eos}
    if meta.get("tokenizer.chat_template"):
        kwargs["chat_template"] = meta["tokenizer.chat_template"]
    if kind == "llama":  # as transformers' LlamaTokenizer / GemmaTokenizer classes have it
        kwargs["padding_side"] = "left"
        if meta.get("general.architecture") in _GEMMA_ARCHS and tk.token_to_id("<mask>") is not None:
            kwargs["mask_token"] = "<mask>"
    return PreTrainedTokenizerFast(tokenizer_object=tk, **kwargs)


def apply_chat_template(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True,
                        tokenize: bool = True, chat_template: Optional[str] = None,
                        **kwargs) -> Union[list[int], str]:
    """Render ``messages`` with the model's chat template.

    Returns token ids (``tokenize=True``) or the prompt text. The template
    writes its own special tokens (BOS etc.), so ids are encoded without adding
    more.
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; pass chat_template=... "
                         "or use generate() with a plain prompt.")
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                         tokenize=False, chat_template=chat_template, **kwargs)
    if not tokenize:
        return text
    return tokenizer.encode(text, add_special_tokens=False)


def bad_words_token_ids(tokenizer, bad_words: Sequence[str]) -> list[list[int]]:
    """Token sequences to ban for ``SamplingParams.bad_words``.

    Each word is encoded as written at the start of text and with a leading
    space (mid-sentence form); distinct encodings are kept.
    """
    out: list[list[int]] = []
    for word in bad_words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out
