"""The C++ int8-weight few-row matmul (kernels_pallas/cpu/qmatmul.cc).

* ``(x @ q) * scale`` and ``(x @ q.T) * scale`` match numpy (float64) within
  1e-4 * sqrt(K) for odd shapes: K and N past the 16-column / 4-row tiles, K
  not a multiple of 8 (the scalar transposed path), every row count 1..32.
* Every build path (this CPU's full set, AVX2 + FMA, portable) passes its
  self-test and matches numpy; the ones this machine cannot run are skipped,
  naming why. The AVX2 and AVX-512 paths give the same bits, and a row's bits
  do not depend on the other rows of its batch.
* In a model, int8 weights go to the kernel exactly where the plan runs
  float32 matmuls in C++ (rows <= native_matmul_rows, one device).
"""

from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.kernels_pallas.cpu import build as cpu_build, qmatmul as cpu_qmatmul
from tests.kernels_pallas.test_cpu_native import _flag_id, build_path

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the C++ kernel is for the CPU backend")

qmm = jax.jit(cpu_qmatmul.qmatmul, static_argnames=("transposed",))


def _case(m, k, n, transposed, seed=0):
    rng = np.random.default_rng(seed + m * 1000 + k + n)
    x = rng.standard_normal((m, k), np.float32)
    q = rng.integers(-127, 128, (n, k) if transposed else (k, n)).astype(np.int8)
    scale = rng.uniform(0.001, 0.05, n).astype(np.float32)
    return x, q, scale


def _ref(x, q, scale, transposed):
    w = (q.T if transposed else q).astype(np.float64)
    return (x.astype(np.float64) @ w) * scale.astype(np.float64)


def _assert_matches(out, x, q, scale, transposed):
    ref = _ref(x, q, scale, transposed)
    k = x.shape[1]
    tol = 1e-4 * np.sqrt(k) * (1 + np.abs(ref))
    assert out.shape == ref.shape and np.all(np.abs(out - ref) <= tol), \
        f"max |diff| {np.abs(out - ref).max():.3g}"


def test_builds_here():
    assert cpu_qmatmul.available(), cpu_qmatmul.unavailable_reason()
    info = cpu_build.build_info("cpu_qmatmul")
    assert info is not None and info["so"].endswith(".so")
    if platform.machine() in ("x86_64", "AMD64"):
        assert cpu_qmatmul.fast()


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 576, 960), (3, 40, 37), (7, 300, 130), (16, 256, 64),
                                   (13, 12, 5), (2, 1, 16), (32, 600, 200), (9, 20, 3)])
def test_qmatmul_matches_numpy(m, k, n, transposed):
    x, q, scale = _case(m, k, n, transposed)
    out = np.asarray(qmm(jnp.asarray(x), jnp.asarray(q), jnp.asarray(scale),
                         transposed=transposed))
    _assert_matches(out, x, q, scale, transposed)


@pytest.mark.parametrize("transposed", [False, True])
def test_every_row_count_up_to_32(transposed):
    """M = 1..32 (past 6-row tiles and 2-row pairs) on one odd shape, each against numpy,
    and each row's bits equal to the same row computed alone (no dependence on the batch)."""
    x, q, scale = _case(32, 136, 83, transposed, seed=7)
    xj, qj, sj = jnp.asarray(x), jnp.asarray(q), jnp.asarray(scale)
    alone = np.concatenate([np.asarray(qmm(xj[i:i + 1], qj, sj, transposed=transposed))
                            for i in range(32)])
    for m in range(1, 33):
        out = np.asarray(qmm(xj[:m], qj, sj, transposed=transposed))
        _assert_matches(out, x[:m], q, scale, transposed)
        np.testing.assert_array_equal(out, alone[:m])


def test_smollm2_shapes_split_over_threads():
    """SmolLM2's MLP shapes (K split into parts over the pool) and its tied LM head."""
    for m, k, n, t in [(8, 576, 1536, False), (4, 1536, 576, False), (3, 576, 4099, True)]:
        x, q, scale = _case(m, k, n, t, seed=3)
        _assert_matches(np.asarray(qmm(jnp.asarray(x), jnp.asarray(q), jnp.asarray(scale),
                                       transposed=t)), x, q, scale, t)


def test_bad_shapes_and_other_dtypes():
    x, q, scale = (jnp.asarray(a) for a in _case(2, 16, 8, False))
    with pytest.raises(ValueError, match="do not match"):
        cpu_qmatmul.qmatmul(x, q, scale[:4])
    with pytest.raises(ValueError, match="do not match"):
        cpu_qmatmul.qmatmul(x[:, :8], q, scale)
    with pytest.raises(ValueError, match="expected x"):
        cpu_qmatmul.qmatmul(x[None], q, scale)
    xb = x.astype(jnp.bfloat16)  # not float32: the jnp product, same contract
    hlo = jax.jit(cpu_qmatmul.qmatmul).lower(xb, q, scale).as_text()
    assert cpu_qmatmul.TARGET not in hlo
    np.testing.assert_allclose(np.asarray(cpu_qmatmul.qmatmul(xb, q, scale), np.float32),
                               np.asarray(cpu_qmatmul.reference(x, q, scale)), rtol=2e-2, atol=0.1)


# ------------------------------------------------------------- build paths
def _path_call(lib, flags, tag):
    target = f"pagedjax_qmatmul_{tag}_{abs(hash(tuple(flags)))}"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.PagedjaxQMatmul), platform="cpu")

    def run(x, q, scale, t):
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0], scale.shape[0]),
                                                             jnp.float32))
        return np.asarray(jax.jit(lambda a, b, c: call(a, b, c, transposed=np.int32(t)))(
            x, q, scale))
    return run


@pytest.mark.parametrize("flags", cpu_build.default_flag_sets(), ids=_flag_id)
def test_every_build_path_matches_numpy(flags):
    """Each instruction-set path passes its self-test in a child process (the builder
    runs it) and here, and matches numpy; paths this machine cannot run are skipped."""
    lib = build_path(cpu_qmatmul.SOURCE, "cpu_qmatmul", flags)
    assert lib.PagedjaxSelfTest() == 0
    run = _path_call(lib, flags, "path")
    for m, k, n, t in [(3, 576, 130, False), (12, 300, 70, False), (1, 40, 37, False),
                       (5, 64, 200, True), (2, 20, 9, True)]:
        x, q, scale = _case(m, k, n, t, seed=11)
        _assert_matches(run(x, q, scale, t), x, q, scale, t)


def test_instruction_set_paths_give_the_same_bits():
    """The AVX-512 tile (where -march=native has it) and the AVX2 tile run the same FMA
    chains on the same exactly widened weights."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"AVX2/AVX-512 paths are x86-64 only; this machine is {platform.machine()}")
    outs = []
    for flags in cpu_build.default_flag_sets()[:2]:
        run = _path_call(build_path(cpu_qmatmul.SOURCE, "cpu_qmatmul", flags), flags, "bits")
        outs.append([run(*_case(m, 576, n, t, seed=5), t)
                     for m, n, t in ((3, 200, False), (12, 200, False), (5, 68, True))])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------- in the models
def _plan(rows, mesh=None):
    from pagedjax.models.base import ExecutionPlan

    return ExecutionPlan(attn_backend="cpu_native", native_matmul_rows=rows, mesh=mesh)


def test_int8_weights_take_the_kernel_exactly_where_the_plan_says():
    """Linear kernels and the tied LM head (Embed.attend) with int8 weights: the custom
    call for <= native_matmul_rows float32 rows on one device, never above that, with
    rows 0, in bfloat16 or under a mesh (today's jnp paths)."""
    from pagedjax.models import nn

    rng = np.random.default_rng(2)
    lin = nn.Linear(64, (2, 24), ("embed", None, "mlp"))
    emb = nn.Embed(40, 64)
    nn.quantize_weights(lin, {("kernel",): "int8"})
    nn.quantize_weights(emb, {("embedding",): "int8"})
    wk = rng.standard_normal((64, 2, 24), np.float32)
    we = rng.standard_normal((40, 64), np.float32)
    from pagedjax.models import quant as Q
    for mod, attr, w, axis in ((lin, "kernel", wk, 0), (emb, "embedding", we, -1)):
        for name, a in Q.quantize_int8(w, axis).items():
            getattr(getattr(mod, attr), name)[...] = jnp.asarray(a)

    def hlo(x, plan):
        return jax.jit(lambda a: (lin(a, plan), emb.attend(a, plan))).lower(x).as_text()

    x8 = jnp.asarray(rng.standard_normal((8, 64), np.float32))
    x9 = jnp.asarray(rng.standard_normal((9, 64), np.float32))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("tp",))
    assert hlo(x8, _plan(8)).count(cpu_qmatmul.TARGET) == 2
    for x, plan in ((x9, _plan(8)), (x8, _plan(0)), (x8, _plan(8, mesh)),
                    (x8.astype(jnp.bfloat16), _plan(8))):
        assert cpu_qmatmul.TARGET not in hlo(x, plan)
    for plan in (_plan(8), _plan(0)):  # both paths: the dequantized weights' product
        y, logits = lin(x8, plan), emb.attend(x8, plan)
        wq = np.asarray(lin.kernel.dequantize(jnp.float32))
        eq = np.asarray(emb.embedding.dequantize(jnp.float32))
        np.testing.assert_allclose(np.asarray(y), np.einsum("ti,ijk->tjk", np.asarray(x8), wq),
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(x8) @ eq.T, rtol=1e-4,
                                   atol=1e-4)


@pytest.fixture(scope="module")
def smollm2_shaped_int8(tmp_path_factory):
    """A random 2-layer Llama with SmolLM2-135M's widths (hidden 576, 9 query / 3 KV
    heads of 64, MLP 1536, tied embeddings; a 4096-token vocabulary), loaded int8."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import pagedjax.models as models

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3,
                      max_position_embeddings=256, tie_word_embeddings=True,
                      rope_theta=100000.0, bos_token_id=1, eos_token_id=2)
    hf = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # wider than the default init: a varied greedy continuation
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))
    path = tmp_path_factory.mktemp("smollm2_shaped")
    hf.save_pretrained(path, safe_serialization=True)
    model, params = models.load_model(str(path), dtype="float32", quantization="int8")
    assert set(model.quantized.values()) == {"int8"}
    return model, model.stack_params(params) if model.can_scan() else params


TOL = 2e-4  # of max(1, max |logit|): only the order of the float sums differs


def _greedy(model, params, prompt, steps, plan):
    """Logits of the prompt's last row and of each decode step (one row), greedy tokens."""
    from pagedjax.models.metadata import SeqChunk, build_metadata

    page_size, pages = 16, [1, 2]
    caches = model.allocate_kv_caches(len(pages) + 1, page_size)
    if model.can_scan():
        caches = model.stack_kv_caches(caches)
    fwd = jax.jit(model.forward, static_argnums=4)
    head = jax.jit(model.compute_logits, static_argnums=2)
    meta = build_metadata([SeqChunk(pages, 0, 1)], page_size, pages_per_seq=len(pages))
    lowered = fwd.lower(params, caches, jnp.zeros((1,), jnp.int32), meta, plan).as_text()
    assert (cpu_qmatmul.TARGET in lowered) == (plan.native_matmul_rows > 0)
    ids, done, all_logits = list(prompt), 0, []
    for _ in range(steps + 1):
        new = ids[done:]
        meta = build_metadata([SeqChunk(pages, done, len(new))], page_size,
                              pages_per_seq=len(pages))
        hidden, caches = fwd(params, caches, jnp.asarray(new, jnp.int32), meta, plan)
        logits = np.asarray(head(params, hidden[-1:], plan))[0]
        all_logits.append(logits)
        done = len(ids)
        ids.append(int(np.argmax(logits)))
    return np.stack(all_logits), ids[len(prompt):]


def test_int8_model_logits_and_greedy_tokens_match_the_jnp_path(smollm2_shaped_int8):
    """The int8 model with its matmuls in the C++ kernel (prompt of 7 rows, then 1-row
    decode steps) against the same model on the jnp int8 paths: logits within
    TOL * max(1, max|logit|), the same greedy tokens."""
    model, params = smollm2_shaped_int8
    prompt = [1, 504, 3458, 314, 260, 1345, 282]
    native, t_native = _greedy(model, params, prompt, 8, _plan(16))
    ref, t_ref = _greedy(model, params, prompt, 8, _plan(0))
    tol = TOL * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(native - ref).max())
    assert np.isfinite(native).all() and err <= tol, f"max |diff| {err:.3g} > {tol:.3g}"
    assert t_native == t_ref
    assert len(set(t_ref)) > 1  # a non-degenerate continuation
