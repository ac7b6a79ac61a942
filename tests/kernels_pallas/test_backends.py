"""The whole engine through each attention backend on the real default model.

On CPU the Pallas kernels run in interpret mode and cpu_native (C++) runs
natively; greedy tokens must equal the xla (pure-jnp reference) backend's.
"""

from __future__ import annotations

import jax
import pytest

from pagedjax.kernels_pallas import resolve_backend
from pagedjax import LLM, SamplingParams

PROMPTS = ["The capital of France is", "def add(a, b):\n    return"]


@pytest.fixture(scope="module")
def xla_tokens():
    llm = LLM(max_model_len=64, num_pages=16, max_num_seqs=4, max_num_batched_tokens=32,
              attention_backend="xla")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("backend", ["cpu_native", "pallas_gpu", "pallas_tpu"])
def test_greedy_tokens_match_xla(backend, xla_tokens):
    llm = LLM(max_model_len=64, num_pages=16, max_num_seqs=4, max_num_batched_tokens=32,
              attention_backend=backend)
    assert llm.llm_engine.attn_backend == backend
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == xla_tokens


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU platform's default")
def test_auto_is_cpu_native_on_cpu():
    assert resolve_backend("auto") == "cpu_native"  # needs g++, part of the test set-up
