"""Models by hub id, from a loopback server in the hub's URL layout (tests/utils/fake_hub.py).

In this process ``huggingface_hub``'s endpoint, cache and offline switch are set on
its ``constants`` module (it reads the environment once, at import); the
subprocess tests set the real environment variables (HF_ENDPOINT, HF_HOME,
HF_HUB_OFFLINE), as a user does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hfh = pytest.importorskip("huggingface_hub")

from pagedjax import LLM, SamplingParams  # noqa: E402
import pagedjax.models as models  # noqa: E402
from tests.distributed.test_parallel import save_tiny_tokenizer  # noqa: E402
from tests.models.test_loader import tiny_llama  # noqa: E402,F401  (fixture)
from tests.utils.fake_hub import FakeHub  # noqa: E402
from tests.utils.paths import REPO  # noqa: E402

VOCAB = 96
GEN_CONFIG = {"temperature": 0.0, "top_k": 7, "max_new_tokens": 5, "do_sample": True}
ENGINE = dict(max_model_len=64, num_pages=32, max_num_seqs=4, page_size=4, dtype="float32")
PROMPT = [5, 17, 33, 2, 71, 8]


def _save_tiny_llama(folder: str, seed: int = 0) -> None:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   eos_token_id=2, bos_token_id=1)
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    save_tiny_tokenizer(folder, VOCAB)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(GEN_CONFIG, f)
    # Files a served model does not need: never downloaded.
    with open(os.path.join(folder, "pytorch_model.bin"), "wb") as f:
        f.write(b"\0" * 1000)
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("# tiny\n")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = FakeHub().start()
    main = str(tmp_path_factory.mktemp("tiny_main"))
    _save_tiny_llama(main, seed=0)
    h.publish("acme/tiny-llama", main)
    other = str(tmp_path_factory.mktemp("tiny_v2"))
    _save_tiny_llama(other, seed=1)
    h.publish("acme/tiny-llama", other, revision="v2")
    h.publish("acme/gated-llama", main, token="hf_secret")
    bert = str(tmp_path_factory.mktemp("bert"))
    with open(os.path.join(bert, "config.json"), "w") as f:
        json.dump({"architectures": ["BertForMaskedLM"], "model_type": "bert"}, f)
    with open(os.path.join(bert, "model.safetensors"), "wb") as f:
        f.write(b"\x02\0\0\0\0\0\0\0{}")
    h.publish("acme/bert", bert)
    yield h
    h.stop()


def _point_at(monkeypatch, url: str) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        url + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture
def online(hub, tmp_path, monkeypatch):
    """huggingface_hub pointed at the fake hub, with an empty cache of its own."""
    from huggingface_hub import constants

    _point_at(monkeypatch, hub.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub.downloads.clear()
    return hub


def test_llm_by_hub_id_then_offline_from_cache(online, tmp_path, monkeypatch):
    from huggingface_hub import constants

    llm = LLM("acme/tiny-llama", **ENGINE)
    fetched = sorted(name for _, name in online.downloads)
    repo = online.repos["acme/tiny-llama"]
    files = repo["commits"][repo["refs"]["main"]]
    published = set(files) - {"pytorch_model.bin", "README.md"}
    assert fetched == sorted(published) and {"config.json", "generation_config.json",
                                              "model.safetensors", "tokenizer.json"} <= published
    assert llm.llm_engine.resolved.path.startswith(str(tmp_path / "hub"))
    # generation_config.json supplies what a request leaves unset ...
    assert llm.llm_engine.default_sampling == {"temperature": 0.0, "top_k": 7, "max_tokens": 5}
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.max_tokens) == (0.0, 5)
    out = llm.generate([PROMPT], use_tqdm=False)[0].outputs[0].token_ids
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=5),
                          use_tqdm=False)[0].outputs[0].token_ids
    assert len(out) == 5 and out == greedy
    # ... and a request's own values win.
    own = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=9),
                       use_tqdm=False)[0].outputs[0].token_ids
    assert len(own) == 9 and own[:5] == greedy
    del llm

    before = len(online.downloads)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _point_at(monkeypatch, "http://127.0.0.1:9")  # nothing listens there
    again = LLM("acme/tiny-llama", **ENGINE)
    assert len(online.downloads) == before
    assert again.generate([PROMPT], use_tqdm=False)[0].outputs[0].token_ids == greedy
    with pytest.raises(FileNotFoundError, match="not in the hub cache.*HF_HUB_OFFLINE"):
        models.resolve_model("acme/never-downloaded")


def test_revision_download_dir_and_switch_off(online, tmp_path):
    target = str(tmp_path / "models")
    main = models.resolve_model("acme/tiny-llama")
    v2 = models.resolve_model("acme/tiny-llama", revision="v2", download_dir=target)
    assert v2.path.startswith(target) and v2.path != main.path
    sha = online.repos["acme/tiny-llama"]["refs"]["v2"]
    assert os.path.basename(v2.path) == sha
    _, p1 = models.load_model(resolved=main, dtype="float32")
    _, p2 = models.load_model(resolved=v2, dtype="float32")
    assert float(abs(p1["norm"]["scale"] - p2["norm"]["scale"]).max()) == 0.0  # ones, both
    e1, e2 = p1["embed_tokens"]["embedding"], p2["embed_tokens"]["embedding"]
    assert float(abs(e1 - e2).max()) > 0  # different weights at the two revisions
    llm = LLM("acme/tiny-llama", revision="v2", download_dir=target,
              generation_config="vllm", **ENGINE)
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.max_tokens) == (1.0, 0, 16)  # SamplingParams' own


def test_clear_errors(online, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no such repository on the hub.*HF_TOKEN"):
        models.resolve_model("acme/nope")
    with pytest.raises(ValueError, match="revision='v9'.*no such branch, tag or commit"):
        models.resolve_model("acme/tiny-llama", revision="v9")
    with pytest.raises(PermissionError, match="gated.*set HF_TOKEN"):
        models.resolve_model("acme/gated-llama")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert models.resolve_model("acme/gated-llama").architecture == "LlamaForCausalLM"
    with pytest.raises(ValueError, match="'BertForMaskedLM' is not supported.*"
                                         "supported: .*LlamaForCausalLM.*OPTForCausalLM"):
        LLM("acme/bert", **ENGINE)


def test_generation_config_folder_setting(tmp_path):
    from pagedjax.engine.generation_defaults import generation_defaults

    assert generation_defaults(GEN_CONFIG) == {"temperature": 0.0, "top_k": 7, "max_tokens": 5}
    assert generation_defaults(GEN_CONFIG, "vllm") == {}
    (tmp_path / "generation_config.json").write_text('{"top_p": 0.5, "repetition_penalty": 1.2}')
    assert generation_defaults(GEN_CONFIG, str(tmp_path)) == {"top_p": 0.5,
                                                              "repetition_penalty": 1.2}
    with pytest.raises(ValueError, match="generation_config=.*no generation_config.json"):
        generation_defaults({}, str(tmp_path / "none"))


def test_dtype_auto_follows_checkpoint_on_accelerators():
    import jax.numpy as jnp

    assert models.resolve_dtype("auto", {"dtype": "bfloat16"}, backend="cpu") == jnp.float32
    assert models.resolve_dtype("auto", {"dtype": "bfloat16"}, backend="gpu") == jnp.bfloat16
    assert models.resolve_dtype("auto", {"torch_dtype": "float16"}, backend="tpu") == jnp.float16
    assert models.resolve_dtype("auto", {"dtype": "float32"}, backend="gpu") == jnp.bfloat16


# ----------------------------------------------------------------------------- as a user does

QUICKSTART = '''
from pagedjax import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)

llm = LLM(model="facebook/opt-125m")

outputs = llm.generate(prompts, sampling_params)

for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
'''


def _save_tiny_opt(folder: str) -> None:
    """A tiny random OPT with a byte-level BPE tokenizer (vocab 300) trained here."""
    from tokenizers import Tokenizer, decoders, models as tm, pre_tokenizers, trainers

    tk = Tokenizer(tm.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["Hello, my name is Ada. The capital of France is Paris. "
                            "The future of AI is bright. The president of the United States."],
                           trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="</s>",
                                         eos_token="</s>", pad_token="<pad>").save_pretrained(folder)
    cfg = transformers.OPTConfig(vocab_size=tk.get_vocab_size(), hidden_size=32, ffn_dim=48,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 max_position_embeddings=128, word_embed_proj_dim=32,
                                 bos_token_id=1, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)


def test_vllm_quickstart_unchanged_then_server_offline(hub, tmp_path):
    """vLLM's quick-start script (its import line aside) downloads ``facebook/opt-125m``
    from the fake hub; then ``pagedjax serve facebook/opt-125m`` with HF_HUB_OFFLINE=1
    starts from the filled cache and answers with the generation-config defaults."""
    from tests.utils.server import start_server, stop_server

    opt = str(tmp_path / "opt")
    _save_tiny_opt(opt)
    with open(os.path.join(opt, "generation_config.json"), "w") as f:
        json.dump({"temperature": 0.0, "max_new_tokens": 4}, f)
    hub.publish("facebook/opt-125m", opt)
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"),
               JAX_PLATFORMS="cpu", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HF_HUB_OFFLINE", None)
    proc = subprocess.run([sys.executable, "-c", QUICKSTART], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("Prompt: ")]
    assert len(lines) == 4 and "'Hello, my name is'" in lines[0], proc.stdout
    assert os.path.isdir(tmp_path / "hf" / "hub" / "models--facebook--opt-125m")

    env_off = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_OFFLINE": "1"}
    srv = start_server(["--model", "facebook/opt-125m", "--max-model-len", "64",
                        "--num-pages", "64"], env_extra=env_off)
    try:
        assert srv.model == "facebook/opt-125m"
        client = srv.client()
        a = client.completions.create(model=srv.model, prompt="Hello, my name is", max_tokens=4)
        b = client.completions.create(model=srv.model, prompt="Hello, my name is",
                                      temperature=0.0, max_tokens=4)
        assert a.choices[0].text == b.choices[0].text  # the default temperature: greedy
        c = [client.completions.create(model=srv.model, prompt="Hello, my name is",
                                       temperature=2.0, max_tokens=4, seed=s).choices[0].text
             for s in range(4)]
        assert any(t != b.choices[0].text for t in c)  # the request's temperature wins
    finally:
        stop_server(srv)


def test_one_gguf_file_of_a_repo(online, tiny_llama, tmp_path):
    """``org/name/FILE.gguf`` and ``org/name:QUANT`` download that one file, nothing else."""
    import shutil

    _, _, gguf_path = tiny_llama
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(gguf_path, repo / "tiny-Q4_1.gguf")
    (repo / "tiny-Q8_0.gguf").write_bytes(b"GGUF never fetched")
    (repo / "README.md").write_text("# gguf\n")
    online.publish("acme/tiny-GGUF", str(repo))
    by_name = models.resolve_model("acme/tiny-GGUF/tiny-Q4_1.gguf")
    by_quant = models.resolve_model("acme/tiny-GGUF:q4_1")
    assert by_name.gguf_file == by_quant.gguf_file == "tiny-Q4_1.gguf"
    assert sorted(set(online.downloads)) == [("acme/tiny-GGUF", "tiny-Q4_1.gguf")]
    local = models.resolve_model(gguf_path)
    assert by_name.hf_config == local.hf_config
    with pytest.raises(FileNotFoundError, match="file 'tiny-Q2_K.gguf' is not in the repository"):
        models.resolve_model("acme/tiny-GGUF/tiny-Q2_K.gguf")
    with pytest.raises(ValueError, match="0 GGUF files match quant type 'Q5_K'"):
        models.resolve_model("acme/tiny-GGUF:Q5_K")


def test_hub_id_or_local_path():
    from pagedjax.models import hub

    assert hub.looks_like_repo_id("facebook/opt-125m")
    assert hub.looks_like_repo_id("org/repo/sub/file.gguf")
    assert hub.split_model_id("org/repo/sub/file.gguf") == ("org/repo", "sub/file.gguf", None)
    assert hub.split_model_id("org/repo:Q4_K_M") == ("org/repo", None, "Q4_K_M")
    for local in ("./a/b", "/abs/path", "~/m/x", "SmolLM2-135M-Instruct", "dir/model.gguf"):
        assert not hub.looks_like_repo_id(local), local
