"""Models by Hugging Face hub id, through ``huggingface_hub`` and its cache.

    folder = hub.download("Qwen/Qwen3-0.6B", revision="main", download_dir=None)
    path = hub.download("unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf")  # one GGUF file
    path = hub.download("unsloth/Qwen3-0.6B-GGUF:Q4_K_M")                   # the same, by type

Only what serving needs is fetched: ``config.json``, ``generation_config.json``,
the tokenizer files and the safetensors weights (or the one GGUF file asked
for), with the library's progress bars. The library's own settings apply:
``HF_TOKEN`` (gated and private models), ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``
(then only the cache is read), ``HF_HOME`` / ``HF_HUB_CACHE`` (where the
cache is); ``download_dir`` replaces the cache folder, as in vLLM.
"""

from __future__ import annotations

import fnmatch
import re

# Files a served model needs besides its weights.
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja",
    "chat_template.json", "preprocessor_config.json",
)
WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json")

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def looks_like_repo_id(model: str) -> bool:
    """``org/name``, ``org/name/file.gguf`` or ``org/name:QUANT`` (not a local path)."""
    repo, _, _ = split_model_id(model)
    return (bool(_REPO_ID.match(repo)) and not repo.endswith(".gguf")
            and not model.startswith(("/", ".", "~")))


def split_model_id(model: str) -> tuple[str, str | None, str | None]:
    """-> (repo id, GGUF file name or None, GGUF quant type or None)."""
    repo, quant = model, None
    if ":" in model:
        repo, _, quant = model.partition(":")
    parts = repo.split("/")
    if len(parts) > 2 and parts[-1].endswith(".gguf"):
        return "/".join(parts[:2]), "/".join(parts[2:]), quant
    return repo, None, quant


def download(model: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """The local path of hub model ``model``: a snapshot folder, or a GGUF file's path.

    Errors name what to change: an unknown repository or revision, a gated or
    private repository without a token, a model not in the cache while offline,
    a repository with no safetensors weights."""
    import huggingface_hub as hfh
    from huggingface_hub import errors

    repo, gguf_file, quant = split_model_id(model)
    kw = dict(repo_id=repo, revision=revision, cache_dir=download_dir)
    try:
        if gguf_file is None and quant is not None:
            gguf_file = _gguf_by_quant(repo, quant, revision)
        if gguf_file is not None:
            return hfh.hf_hub_download(filename=gguf_file, **kw)
        folder = hfh.snapshot_download(
            allow_patterns=[*CONFIG_FILES, *TOKENIZER_FILES, *WEIGHT_PATTERNS], **kw)
    except errors.GatedRepoError as e:
        raise PermissionError(
            f"model {model!r} is gated: accept its licence on the hub page "
            f"(https://huggingface.co/{repo}) and set HF_TOKEN to a token of that account") from e
    except errors.RevisionNotFoundError as e:
        raise ValueError(f"revision={revision!r}: model {repo!r} has no such branch, tag or "
                         "commit on the hub; give an existing one (default: main)") from e
    except errors.RepositoryNotFoundError as e:
        raise FileNotFoundError(
            f"model {model!r}: no such repository on the hub (or it is private: set HF_TOKEN "
            "to a token that can read it), and no local folder or .gguf file of that name") from e
    except errors.LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"model {model!r} is not in the hub cache"
            f"{' at ' + download_dir if download_dir else ''} and cannot be downloaded "
            "(HF_HUB_OFFLINE is set or the hub is unreachable); unset HF_HUB_OFFLINE, or "
            "download it once while online") from e
    except errors.RemoteEntryNotFoundError as e:
        raise FileNotFoundError(f"model {model!r}: the file {gguf_file!r} is not in the "
                                f"repository {repo!r} at revision {revision or 'main'}") from e
    _check_weights(folder, model)
    return folder


def _gguf_by_quant(repo: str, quant: str, revision: str | None) -> str:
    """The one ``.gguf`` file of ``repo`` whose name carries quant type ``quant``."""
    import huggingface_hub as hfh
    from huggingface_hub import errors

    try:
        listing = hfh.HfApi().list_repo_files(repo, revision=revision)
    except errors.OfflineModeIsEnabled as e:
        raise FileNotFoundError(f"model {repo}:{quant}: choosing a GGUF file by quant type "
                                "needs the hub (HF_HUB_OFFLINE is set); name the file instead: "
                                f"{repo}/FILE.gguf") from e
    files = [f for f in listing if f.endswith(".gguf")]
    want = [f for f in files if fnmatch.fnmatch(f.lower(), f"*{quant.lower()}*.gguf")]
    if len(want) != 1:
        raise ValueError(f"model {repo}:{quant}: {len(want)} GGUF files match quant type "
                         f"{quant!r}; name one file as {repo}/FILE.gguf (files: {files[:12]})")
    return want[0]


def _check_weights(folder: str, model: str) -> None:
    import os

    names = os.listdir(folder)
    if "config.json" not in names:
        raise FileNotFoundError(f"model {model!r}: the repository has no config.json; "
                                "pagedjax serves transformers-format repositories or a GGUF file "
                                f"({model}/FILE.gguf)")
    if not any(n.endswith(".safetensors") for n in names):
        raise FileNotFoundError(
            f"model {model!r}: the repository has no *.safetensors weights (pagedjax does not "
            "read PyTorch .bin files); pick a repository with safetensors, or a GGUF file")
