"""The step's weights packed in one buffer (pagedjax/worker/param_pack.py).

* On the default model (GGUF blocks), the step program takes a handful of arguments,
  not hundreds: the Linear layers' block components and the norms lie in one buffer,
  the engine's weights are views of that buffer (no second copy), and the step's
  trace hands the block kernel that buffer for each of the 4 projections of every
  layer.
* Its greedy tokens and logprobs are bit for bit those of the same engine with nothing
  packed: the kernels read the same bytes.
* A pack keeps serving weights that keep its arrays where it packed (a LoRA write
  replaces others); the trace rebuilds every leaf in tree order. Weights handed over
  are freed as they are copied (the load's peak memory).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax import LLM, SamplingParams
from pagedjax.worker import runner as runner_mod
from pagedjax.worker.param_pack import ParamPack
from tests.utils.step_trace import trace_decode_step

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="packing is for the CPU")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,",
           "List three colours:"]


def _pointer_in(a, buffer) -> bool:
    base = buffer.unsafe_buffer_pointer()
    return base <= a.unsafe_buffer_pointer() < base + buffer.size


def test_default_model_steps_take_one_buffer_and_match_the_unpacked_engine(
        smollm2_gguf, monkeypatch):
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    kw = dict(quantization="gguf", max_model_len=256, max_num_seqs=4, num_pages=64)
    llm = LLM(smollm2_gguf, **kw)
    runner = llm.llm_engine.runner
    leaves = jax.tree_util.tree_flatten_with_path(llm.llm_engine.params)[0]
    assert len(leaves) > 400 and len(runner.param_args) <= 4, len(runner.param_args)
    buffer = runner.param_args[0]
    assert buffer.dtype == jnp.uint8 and buffer.ndim == 1
    layer_leaves = [a for p, a in leaves if "layers" in jax.tree_util.keystr(p)]
    assert all(_pointer_in(a, buffer) for a in layer_leaves)  # views, not copies
    assert _found_in_place(runner, monkeypatch) == 4 * llm.llm_engine.info.num_layers
    packed = [o.outputs[0] for o in llm.generate(PROMPTS, sp, use_tqdm=False)]
    del llm, runner, buffer, leaves, layer_leaves

    monkeypatch.setattr(runner_mod.Runner, "_pack_select", lambda self, params: [])
    plain_llm = LLM(smollm2_gguf, **kw)
    assert len(plain_llm.llm_engine.runner.param_args) > 400
    assert _found_in_place(plain_llm.llm_engine.runner, monkeypatch) == 0
    plain = [o.outputs[0] for o in plain_llm.generate(PROMPTS, sp, use_tqdm=False)]
    for a, b in zip(packed, plain):
        assert a.token_ids == b.token_ids
        assert a.cumulative_logprob == b.cumulative_logprob


def _found_in_place(runner, monkeypatch) -> int:
    """How many block-kernel calls a fresh trace of the one-row decode step hands the
    packed buffer (kernels_pallas/packed.py ``sources``) rather than a copied slice."""
    from pagedjax.kernels_pallas import packed as packed_mod

    found = []
    real = packed_mod.sources
    monkeypatch.setattr(packed_mod, "sources", lambda a: found.append(real(a)) or found[-1])
    trace_decode_step(runner)
    monkeypatch.setattr(packed_mod, "sources", real)
    return sum(f is not None for f in found)


def test_a_pack_serves_the_weights_it_packed():
    rng = np.random.default_rng(0)
    leaves = [jnp.asarray(rng.standard_normal(8).astype(np.float32)),
              jnp.asarray(rng.integers(0, 256, (4, 6), dtype=np.uint8)),
              jnp.asarray(rng.standard_normal((3, 3)).astype(np.float32)),
              jnp.asarray(rng.standard_normal(5).astype(np.float16))]
    pack = ParamPack(leaves, [True, True, False, True])
    assert len(pack.args) == 2 and pack.args[1] is leaves[2]
    for a, b in zip(pack.leaves, leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert pack.holds(pack.leaves)
    other = leaves[2] + 1  # a weight it did not pack, replaced (a LoRA table, say)
    assert pack.holds([pack.leaves[0], pack.leaves[1], other, pack.leaves[3]])
    assert pack.args_of([pack.leaves[0], pack.leaves[1], other, pack.leaves[3]]) == \
        (pack.buffer, other)
    assert not pack.holds([leaves[0]] + list(pack.leaves[1:]))

    def rebuild(args):
        with pack.unpacked(args) as out:
            return out
    for a, b in zip(jax.jit(rebuild)(pack.args), leaves):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    nothing = ParamPack(leaves, [False, False, False, False])
    assert nothing.args == tuple(leaves) and nothing.buffer is None

    # Handed over: each packed weight is freed once copied, the others are kept, and so is
    # an array found at two places of the tree.
    leaves.append(leaves[3])
    values = [np.asarray(a).copy() for a in leaves]
    given = ParamPack(leaves, [True, True, False, True, False], release=True)
    assert [a.is_deleted() for a in leaves] == [True, True, False, False, False]
    for a, b in zip(given.leaves, values):
        np.testing.assert_array_equal(np.asarray(a), b)
