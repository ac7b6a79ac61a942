"""GGUF blocks through the C++ block kernel inside the models.

* A tiny Llama GGUF (Q4_0 q/k/v, Q4_K output projection, Q6_K gate/up, Q4_1
  down projection, tied Q8_0 embedding): with ``plan.block_matmul_rows`` covering a step, its
  logits equal those of the same file dequantized at load within
  2e-4 * max(1, max|ref|) (the kernel sums the dequantized weights' products in
  float32, in another order), the step's program calls the kernel, and with the
  limit at 0 it does not.
* The default model (SmolLM2 Q4_1, slow): on 16 prompts the block kernel gives
  the same greedy tokens as the weights dequantized at load, and the chosen
  tokens' logprobs agree within 2e-3.
* ``quantization`` accepts "none"; unset, a GGUF file on the CPU keeps its
  blocks exactly when the measured choice says the kernel wins (the engine
  logs which).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pagedjax.models as models  # noqa: E402
from pagedjax.kernels_pallas.cpu import blockmatmul as cpu_block  # noqa: E402
from pagedjax.models.base import ExecutionPlan  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402
from tests.utils import gguf_models  # noqa: E402
from tests.utils.paths import REPO_ROOT  # noqa: E402

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the C++ block kernel is for the CPU backend")
TOL = 2e-4


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    kinds = {"attn_q": "q4_0", "attn_k": "q4_0", "attn_v": "q4_0", "attn_output": "q4_k",
             "ffn_gate": "q6_k", "ffn_up": "q6_k", "ffn_down": "q4_1"}  # q/k/v, gate/up fuse
    path = str(tmp_path_factory.mktemp("blocks") / "tiny.gguf")
    return gguf_models.write_llama_gguf(path, kinds, "q8_0", np.random.default_rng(7),
                                        vocab=80, amplitude=0.1, d_max=0.01)


def _step(model, params, ids, plan):
    """(logits of every row, the step's lowered program text)."""
    meta = build_metadata([SeqChunk(list(range(1, 1 + -(-len(ids) // 4))), 0, len(ids))], 4)
    caches = model.allocate_kv_caches(-(-len(ids) // 4) + 1, 4)

    def run(params, caches, ids, meta):
        hidden, _ = model.forward(params, caches, ids, meta, plan)
        return model.compute_logits(params, hidden, plan)

    args = (params, caches, jnp.asarray(ids, jnp.int32), meta)
    text = jax.jit(run).lower(*args).as_text()
    return np.asarray(jax.jit(run)(*args)), text


def test_tiny_model_through_the_block_kernel(tiny_gguf):
    assert cpu_block.available(), cpu_block.unavailable_reason()
    m_f, p_f = models.load_model(tiny_gguf, dtype="float32")
    m_q, p_q = models.load_model(tiny_gguf, dtype="float32", quantization="gguf")
    assert set(m_q.quantized.values()) == {"q8_0", "q4_0", "q4_1", "q4_k", "q6_k"}
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 80, 11)]
    ref, _ = _step(m_f, p_f, ids, ExecutionPlan(attn_backend="cpu_native"))
    tol = TOL * max(1.0, float(np.abs(ref).max()))
    for rows in (64, 0):
        plan = ExecutionPlan(attn_backend="cpu_native", block_matmul_rows=rows)
        got, text = _step(m_q, p_q, ids, plan)
        assert (cpu_block.TARGET in text) == (rows > 0)
        err = float(np.abs(got - ref).max())
        assert np.isfinite(got).all() and err <= tol, f"rows {rows}: {err:.3g} > {tol:.3g}"


def test_quantization_none_dequantizes(tiny_gguf):
    m, p = models.load_model(tiny_gguf, dtype="float32", quantization="none")
    assert m.quantized == {}
    with pytest.raises(ValueError, match="quantization"):
        models.load_model(tiny_gguf, quantization="q4")


def test_default_for_gguf_follows_the_measured_choice(monkeypatch, tiny_gguf):
    from pagedjax.config import EngineArgs
    from pagedjax.engine.startup import weight_quantization

    resolved = models.resolve_model(tiny_gguf)
    monkeypatch.setenv("PAGEDJAX_BLOCK_MATMUL_ROWS", "0")  # read before any cache
    from pagedjax.kernels_pallas.cpu import quant_rows

    assert quant_rows.decide("block", "unused.so", measure_fn=None) == {"rows": 0,
                                                                        "default": False}
    assert weight_quantization(EngineArgs(model=tiny_gguf, quantization="none"), resolved) == "none"
    assert weight_quantization(EngineArgs(model=tiny_gguf, quantization="gguf"), resolved) == "gguf"
    assert weight_quantization(EngineArgs(model=tiny_gguf, tensor_parallel_size=2),
                               resolved) is None
    assert weight_quantization(EngineArgs(model=tiny_gguf, attention_backend="xla"),
                               resolved) is None


def test_quant_kernel_choice_rule(tmp_path, monkeypatch):
    from pagedjax.kernels_pallas.cpu import quant_rows

    win = {r: {"cpp": 1.0, "jnp": 2.0, "float": 1.5} for r in (1, 16, 128)}
    assert quant_rows.choose(win) == {"rows": quant_rows.EVERY_STEP, "default": True}
    lose_big = {**win, 128: {"cpp": 2.0, "jnp": 2.5, "float": 1.0}}
    assert quant_rows.choose(lose_big) == {"rows": quant_rows.EVERY_STEP, "default": False}
    tie = {**win, 128: {"cpp": 1.04, "jnp": 2.5, "float": 1.0}}  # within the noise: default
    assert quant_rows.choose(tie) == {"rows": quant_rows.EVERY_STEP, "default": True}
    lose_small = {**win, 128: {"cpp": 1.07, "jnp": 2.5, "float": 1.0}}
    assert quant_rows.choose(lose_small) == {"rows": quant_rows.EVERY_STEP, "default": False}
    only_ties = {r: {"cpp": 1.02, "jnp": 2.0, "float": 1.0} for r in (1, 16, 128)}
    assert quant_rows.choose(only_ties)["default"] is False  # never faster: float stays
    never = {r: {"cpp": 3.0, "jnp": 2.0, "float": 1.0} for r in (1, 16)}
    assert quant_rows.choose(never) == {"rows": 0, "default": False}
    assert quant_rows.choose(win, "int8") == {"rows": 128, "default": False}  # a limit only
    # measured once, then cached beside the build, per kernel; int8 is never a default
    for k in quant_rows.KERNELS:
        monkeypatch.delenv(quant_rows.ENV[k], raising=False)
    so, calls = tmp_path / "lib.so", []
    for kernel, want in (("block", {"rows": quant_rows.EVERY_STEP, "default": True}),
                         ("int8", {"rows": 128, "default": False})):
        got = quant_rows.decide(kernel, so, lambda: calls.append(kernel) or win)
        assert got == want  # the block kernel wins up to the largest count: every step
        assert quant_rows.decide(kernel, so, None) == got  # from the cache
    assert calls == ["block", "int8"]
    monkeypatch.setenv(quant_rows.ENV["int8"], "x")
    with pytest.raises(ValueError, match="PAGEDJAX_INT8_MATMUL_ROWS"):
        quant_rows.decide("int8", so, None)


def test_a_count_over_the_tie_is_measured_again():
    """Where the block kernel looks slower than float32 beyond the tie, ``measure`` runs
    ``confirm`` more series of that count before choosing (the paths' calls counted)."""
    from pagedjax.kernels_pallas.cpu import blockmatmul, quant_rows
    from pagedjax.models import quant as Q

    if not blockmatmul.available():
        pytest.skip(f"the C++ block matmul is unavailable: {blockmatmul.unavailable_reason()}")
    calls = []

    def instant(x, w):  # "float32" that does nothing: the kernel loses by far
        jax.debug.callback(lambda: calls.append(1))
        return jnp.zeros((x.shape[0], w.shape[1]), x.dtype)

    def dequantize(kind, c):
        return Q.dequantize(kind, c, 0, jnp.float32)

    shapes = ((4096, 2048),)  # a kernel call far slower than the callback
    for confirm, series in ((0, 1), (2, 3)):
        calls.clear()
        out = quant_rows.measure("block", dequantize, lambda k, x, c: x[:, :32], instant,
                                 rows=(1,), reps=2, shapes=shapes, confirm=confirm)
        assert out[1]["cpp"] > quant_rows.TIE * out[1]["float"]
        jax.effects_barrier()
        assert len(calls) == 1 + 2 * series  # the warm-up call, then reps a series


_PARITY = r"""
import json, sys
from pagedjax import LLM, SamplingParams
prompts = [f"Question {i}: name one thing about the number {i * 7 + 3}." for i in range(16)]
llm = LLM(sys.argv[1], quantization=sys.argv[2], max_num_seqs=16, max_model_len=256,
          cpu_kv_cache_gib=0.25)
res = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, logprobs=1))
print("RESULT" + json.dumps({
    "rows": llm.llm_engine.runner.plan.block_matmul_rows,
    "tokens": [list(r.outputs[0].token_ids) for r in res],
    "lp": [[d[t].logprob for d, t in zip(r.outputs[0].logprobs, r.outputs[0].token_ids)]
           for r in res]}))
"""


def _generate(model: str, quantization: str) -> dict:
    """Greedy tokens and logprobs of 16 prompts, in a process of its own."""
    env = dict(os.environ, PAGEDJAX_BLOCK_MATMUL_ROWS="4096")  # every step through the kernel
    r = subprocess.run([sys.executable, "-c", _PARITY, model, quantization],
                       capture_output=True, text=True, timeout=1200, env=env, cwd=REPO_ROOT)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert r.returncode == 0 and line, (r.returncode, r.stderr[-3000:])
    return json.loads(line[0][len("RESULT"):])


@pytest.mark.slow
def test_default_model_greedy_tokens_equal_dequantized(smollm2_gguf):
    ours, ref = _generate(smollm2_gguf, "gguf"), _generate(smollm2_gguf, "none")
    assert ours["rows"] == 4096
    assert ours["tokens"] == ref["tokens"]
    for a, b in zip(ours["lp"], ref["lp"]):
        assert np.allclose(a, b, atol=2e-3), (a, b)
