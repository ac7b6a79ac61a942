"""A custom architecture registered in one file (tests/utils/custom_model_example.py)
served through models.load_model, LLM.generate and tensor parallelism, checked
against a plain numpy implementation of the same model.

Tolerance: 2e-4 * max(1, max|ref logits|) (fp32 vs the float64 reference).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import pagedjax.models as models
from pagedjax.models.metadata import SeqChunk, build_metadata
from tests.utils import custom_model_example as ex


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("custom"))
    tensors = ex.save_random_checkpoint(path)
    from tests.distributed.test_parallel import save_tiny_tokenizer

    save_tiny_tokenizer(path, ex.CONFIG["vocab_size"])
    return path, tensors


def _close(ours, ref, what):
    tol = 2e-4 * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(np.asarray(ours) - ref).max())
    assert err <= tol, f"{what}: max |diff| {err:.3g} > {tol:.3g}"


def test_registered_and_loaded(folder):
    path, tensors = folder
    assert models.model_class("MyForCausalLM") is ex.MyForCausalLM
    model, params = models.load_model(path, dtype="float32")
    assert model.info.num_kv_heads == 2 and model.info.architecture == "MyForCausalLM"
    assert params["layers"][1]["attn"]["qkv_proj"]["kernel"].shape == (64, 2, 4, 16)
    axes = model.logical_axes()
    assert axes["layers"][0]["attn"]["qkv_proj"]["kernel"] == ("embed", "kv_heads", "qkv", "head_dim")
    assert axes["layers"][0]["mlp"]["fc1"]["bias"] == ("mlp",)
    ids = [int(i) for i in np.random.default_rng(3).integers(0, 96, 11)]
    meta = build_metadata([SeqChunk([5, 2, 7], 0, len(ids))], 4)
    hidden, _ = jax.jit(model.forward)(params, model.allocate_kv_caches(8, 4),
                                       jnp.asarray(ids, jnp.int32), meta)
    _close(model.compute_logits(params, hidden), ex.reference_logits(tensors, ids), "custom")


def test_served_by_llm_generate(folder):
    from pagedjax import LLM, SamplingParams

    path, tensors = folder
    llm = LLM(path, num_pages=32, max_model_len=64)
    prompts = [[1, 17, 42, 5, 9], [1, 60, 61]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        seq = list(prompt)
        for _ in range(6):  # greedy decoding with the numpy reference
            seq.append(int(np.argmax(ex.reference_logits(tensors, seq)[-1])))
        assert list(out.outputs[0].token_ids) == seq[len(prompt):]


def test_int8_and_bad_quantization(folder):
    path, tensors = folder
    m, p = models.load_model(path, dtype="float32", quantization="int8")
    assert p["layers"][0]["attn"]["qkv_proj"]["kernel"]["q"].dtype == jnp.int8
    assert p["embed_tokens"]["embedding"]["scale"].shape == (96,)  # one per vocabulary row
    with pytest.raises(ValueError, match="needs a .gguf checkpoint"):
        models.load_model(path, quantization="gguf")


def test_bad_registrations():
    from flax import nnx

    with pytest.raises(TypeError, match="not a flax.nnx.Module"):
        models.register_model("X")(object)

    class NoMap(nnx.Module):
        def embed(self): ...

    with pytest.raises(TypeError, match="final"):
        models.register_model("Y")(NoMap)
    with pytest.raises(ValueError, match="architecture"):
        models.register_model("")


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_tensor_parallel(folder, quantization):
    """TP=2 shards the custom model by its logical axes (int8 components too) and
    gives TP=1's tokens and logprobs."""
    from tests.distributed.test_parallel import _assert_same, run_isolated

    path, _ = folder
    runs = run_isolated({"kind": "generate", "model": path, "tps": [1, 2],
                         "imports": ["tests.utils.custom_model_example"],
                         "quantization": quantization})
    _assert_same(runs["1"], runs["2"], f"custom model TP=2 ({quantization})")
    assert "layers/0/attn/qkv_proj/kernel" not in " ".join(runs["2"]["replicated"])
    w1, w2 = sum(runs["1"]["weights"].values()), max(runs["2"]["weights"].values())
    assert w2 < 0.8 * w1  # each device holds about half of the split weights
