"""The engine's whole step compiled by libtpu for TPU slices, without a TPU.

pagedjax/worker/aot.py builds the engine's runner over compile-only devices
of a described slice with shape-only weights and KV pool; libtpu compiles the
model (Mosaic attention kernel inside), the sampler and the page copies. The
layer count is cut to 2 here (compile time); the full-depth models are
``benchmarks/kernel_bench/tpu_compile_check.py`` (BENCHMARKS.md).
"""

from __future__ import annotations

import functools

import jax
import pytest

from pagedjax.kernels_pallas.pallas import tpu_compile as tc


@functools.lru_cache(maxsize=None)
def _missing():
    return tc.libtpu_missing()


@pytest.fixture(autouse=True)
def _need_libtpu():
    reason = _missing()
    if reason:
        pytest.skip(f"libtpu cannot compile here: {reason}")


def _llama_8b(num_layers: int):
    import jax.numpy as jnp

    import pagedjax.models as models
    from pagedjax.models.runtime import CausalLM

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": num_layers,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    }
    return CausalLM(models.model_class("LlamaForCausalLM"), config, jnp.bfloat16)


def test_8b_shaped_step_compiles_tp4_on_v5e_2x2():
    from pagedjax.worker import aot

    model = _llama_8b(2)
    devices = aot.tpu_devices("v5e:2x2")
    runner = aot.abstract_runner(model, devices, tp=4, num_pages=512)
    progs = aot.compile_step(runner, devices[0], kinds=("decode",))
    assert [p.program.split()[0] for p in progs] == ["model", "sampler", "page"]
    model_prog = progs[0]
    kv_chip = aot.per_chip_bytes(runner.kv_caches)
    # 2 layers x 512 pages x [2, 8/4 heads, 16, 128] bf16 per chip, updated in place.
    assert kv_chip == 2 * 512 * 2 * 2 * 16 * 128 * 2
    assert model_prog.aliased == kv_chip
    weights_chip = aot.per_chip_bytes(runner.params)
    total = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(runner.params))
    assert total / 4 <= weights_chip < total / 3  # split 4 ways (norms replicated)
    assert model_prog.arguments >= weights_chip + kv_chip
    assert aot.kv_bytes_per_page_per_chip(model, 16, model.dtype, 4) == kv_chip // 512


def test_default_model_step_compiles_on_v6e_1x1(smollm2_gguf):
    import jax.numpy as jnp

    import pagedjax.models as models
    from pagedjax.models.runtime import CausalLM
    from pagedjax.worker import aot

    resolved = models.resolve_model(smollm2_gguf)
    config = dict(resolved.hf_config, num_hidden_layers=2)
    model = CausalLM(models.model_class(resolved.architecture), config, jnp.bfloat16)
    devices = aot.tpu_devices("v6e:1x1")
    runner = aot.abstract_runner(model, devices, num_pages=256)
    progs = aot.compile_step(runner, devices[0], kinds=("mixed",))
    assert progs[0].program.startswith("model mixed")
    assert progs[0].aliased == aot.per_chip_bytes(runner.kv_caches)


def test_tensor_parallel_that_cannot_split_the_heads_is_refused():
    from pagedjax.worker import aot

    model = _llama_8b(1)
    devices = aot.tpu_devices("v5e:2x2")
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        aot.abstract_runner(model, devices, tp=3, num_pages=64)
    with pytest.raises(ValueError, match="tp: 8 exceeds the 4 devices"):
        aot.abstract_runner(model, devices, tp=8, num_pages=64)
