"""kv_cache_dtype="float16" on the real default model: a pool of half the bytes
(twice the pages for the same memory), greedy tokens and their logprobs as with
the model's float32 pool, the 'xla' backend reading the same float16 pool alike,
and a clear error where a kernel does not read float16 pages."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "List three fruits:",
]
TOKENS = 24
GIB = 0.02  # the KV budget of both engines (27 float32 pages): float16 gets twice the pages


def _run(**kw):
    llm = LLM(max_model_len=256, max_num_seqs=4, cpu_kv_cache_gib=GIB, **kw)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0.0,
                                                ignore_eos=True, logprobs=0))
    pools = jax.tree_util.tree_leaves(llm.llm_engine.runner.kv_caches)
    got = {"num_pages": llm.llm_engine.num_pages,
           "dtypes": {jnp.dtype(a.dtype) for a in pools},
           "pool_bytes": sum(a.nbytes for a in pools),
           "tokens": [list(o.outputs[0].token_ids) for o in outs],
           "logprobs": [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs,
                                                         o.outputs[0].token_ids)]
                        for o in outs]}
    del llm
    return got


@pytest.fixture(scope="module")
def runs(smollm2_gguf):
    return {"auto": _run(), "float16": _run(kv_cache_dtype="float16")}


def test_float16_pool_holds_twice_the_pages_in_the_same_bytes(runs):
    f32, f16 = runs["auto"], runs["float16"]
    assert f32["dtypes"] == {jnp.dtype(jnp.float32)}
    assert f16["dtypes"] == {jnp.dtype(jnp.float16)}
    assert f16["num_pages"] == pytest.approx(2 * f32["num_pages"], abs=2)
    assert f16["pool_bytes"] == pytest.approx(f32["pool_bytes"], rel=0.01)


def test_float16_pool_gives_the_float32_pools_greedy_tokens(runs):
    """Keys and values rounded to float16 (11 bits of mantissa) move the logprobs by
    about 1e-3 here; the greedy tokens stay those of the float32 pool."""
    f32, f16 = runs["auto"], runs["float16"]
    assert f16["tokens"] == f32["tokens"]
    err = max(abs(a - b) for la, lb in zip(f32["logprobs"], f16["logprobs"])
              for a, b in zip(la, lb))
    assert 0 < err < 2e-2, err  # not the float32 pool by mistake, and close to it


def test_xla_backend_reads_the_float16_pool_like_the_cpu_kernel(runs):
    xla = _run(kv_cache_dtype="float16", attention_backend="xla")
    assert xla["dtypes"] == {jnp.dtype(jnp.float16)}
    assert xla["tokens"] == runs["float16"]["tokens"]
    np.testing.assert_allclose(np.concatenate(xla["logprobs"]),
                               np.concatenate(runs["float16"]["logprobs"]), atol=5e-3)


def test_float16_pool_on_a_kernel_without_it_is_a_clear_error(smollm2_gguf):
    with pytest.raises(ValueError, match=r"kv_cache_dtype='float16'.*'pallas_tpu'.*int8"):
        LLM(max_model_len=256, kv_cache_dtype="float16", attention_backend="pallas_tpu")


def test_a_16_bit_model_dtype_on_the_cpu_is_named_slow_with_what_to_use():
    from pagedjax.engine.startup import slow_dtype_warning

    for dt in (jnp.bfloat16, jnp.float16):
        msg = slow_dtype_warning(dt, "cpu")
        assert msg and jnp.dtype(dt).name in msg and "dtype='auto'" in msg
        assert "kv_cache_dtype='float16'" in msg
        assert slow_dtype_warning(dt, "gpu") is None and slow_dtype_warning(dt, "tpu") is None
    assert slow_dtype_warning(jnp.float32, "cpu") is None


def test_every_kv_cache_dtype_choice_names_a_pool_dtype():
    from pagedjax.config import KV_CACHE_DTYPE_CHOICES
    from pagedjax.kernels_pallas import KV_CACHE_DTYPES

    assert set(KV_CACHE_DTYPE_CHOICES) == {"auto", *KV_CACHE_DTYPES}
