"""Weights kept quantized on the device: GGUF blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)
and per-channel int8 from float checkpoints.

* Dequantizing our repacked components gives exactly ``gguf.quants.dequantize``.
* Logits of a quantized model equal those of the float model run with the same
  dequantized weights within 2e-4 * max(1, max|ref|) (only the order of float
  operations differs: int8 scales are applied after the matmul, steps of few rows
  sum the products of chunks).
* Weight memory: within 10% of the GGUF file's tensor bytes; int8 within 10% of
  a quarter of float32.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import pagedjax.models as models  # noqa: E402
import pagedjax.models.loader  # noqa: E402
from pagedjax.models import quant as Q  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402
from tests.utils import gguf_models  # noqa: E402

GT = gguf.GGMLQuantizationType
TOL = 2e-4


_raw_blocks = gguf_models.raw_blocks


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1", "q4_k", "q6_k"])
def test_gguf_blocks_dequantize_exactly(kind):
    rng = np.random.default_rng(0)
    rows, n = 6, 512
    raw = _raw_blocks(kind, rows, n, rng)
    ref = gguf.quants.dequantize(raw, GT[kind.upper()]).reshape(rows, n)
    comps = Q.repack_gguf(kind, raw, n)  # row layout [rows, n_c]
    for c, shape in Q.component_shapes(kind, (rows, n), -1).items():
        assert comps[c].shape == shape and comps[c].dtype == Q.component_dtypes(kind)[c], c
    as_rows = Q.dequantize(kind, {c: jnp.asarray(a) for c, a in comps.items()}, -1, jnp.float32)
    np.testing.assert_array_equal(np.asarray(as_rows), ref)
    kernel = {c: jnp.asarray(np.ascontiguousarray(a.T)) for c, a in comps.items()}  # [In_c, Out]
    np.testing.assert_array_equal(np.asarray(Q.dequantize(kind, kernel, 0, jnp.float32)), ref.T)
    assert sum(a.nbytes for a in comps.values()) <= 1.03 * raw.nbytes


@pytest.mark.parametrize("kind", ["int8", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"])
@pytest.mark.parametrize("n_in", [256, 1024])  # one chunk, several (1024 x 128 f32 > 256 KiB)
def test_chunked_matmuls_equal_dequantize_then_dot(kind, n_in):
    """The step's matmuls (chunks of In dequantized inside a scan; Q4 nibble halves dotted
    separately) and the tied head's (chunks of vocabulary rows) equal a dot with the
    whole dequantized weight within float rounding."""
    rng = np.random.default_rng(2)
    rows, n_out = 3, 128
    if kind == "int8":
        kernel = {k: jnp.asarray(v) for k, v in Q.quantize_int8(
            rng.standard_normal((n_in, n_out)).astype(np.float32), 0).items()}
    else:
        comps = Q.repack_gguf(kind, _raw_blocks(kind, n_out, n_in, rng), n_in)  # [Out, In_c]
        kernel = {c: jnp.asarray(np.ascontiguousarray(a.T)) for c, a in comps.items()}
    x = jnp.asarray(rng.standard_normal((rows, n_in)), jnp.float32)
    w = Q.dequantize(kind, kernel, 0, jnp.float32)  # [In, Out]
    assert (Q.num_chunks(n_in, Q.BLOCK[kind], n_out) > 1) == (n_in * n_out * 4 > Q.CHUNK_BYTES)
    ref = np.asarray(x @ w)
    got = np.asarray(jax.jit(lambda x, c: Q.chunked_matmul(kind, c, x, jnp.dot))(x, kernel))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    table = {c: jnp.moveaxis(a, 0, -1) if a.ndim == 2 else a for c, a in kernel.items()}
    x_t = jnp.asarray(rng.standard_normal((rows, n_in)), jnp.float32)
    ref_t = np.asarray(x_t @ w)  # table [Out, In] attended: x_t [T, In] @ table.T
    got_t = np.asarray(jax.jit(lambda x, c: Q.chunked_matmul_t(
        kind, c, x, lambda a, b: a @ b.T))(x_t, table))
    np.testing.assert_allclose(got_t, ref_t, rtol=1e-5, atol=1e-5 * np.abs(ref_t).max())


def test_int8_quantize_per_channel():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 3, 5)).astype(np.float32)  # kernel [In, *Out]
    c = Q.quantize_int8(w, 0)
    assert c["q"].dtype == np.int8 and c["scale"].shape == (3, 5)
    back = np.asarray(Q.dequantize("int8", c, 0, jnp.float32))
    assert np.abs(back - w).max() <= np.abs(w).max(axis=0).max() / 127 / 2 + 1e-6
    assert (np.abs(c["q"]).max(axis=0) == 127).all()  # each channel uses the full range


def dequantized_reference(model, params) -> dict:
    """The float state of ``model`` (quantized) with every quantized weight replaced by
    its dequantized float32 value: what the float model should compute."""
    flat = dict(nnx.traversals.flatten_mapping(params))
    out = {}
    done = set()
    for path, kind in model.quantized.items():
        comps = {c: flat[path + (c,)] for c in Q.formats(kind)}
        axis = 0 if path[-1] == "kernel" else -1
        out[path] = Q.dequantize(kind, comps, axis, jnp.float32)
        done.update(path + (c,) for c in comps)
    out.update({p: a for p, a in flat.items() if p not in done})
    return nnx.traversals.unflatten_mapping(out)


def _logits(model, params, ids):
    """Logits of one prompt; the layers scanned (one compiled layer body: fast compiles)."""
    meta = build_metadata([SeqChunk(list(range(1, 1 + -(-len(ids) // 4))), 0, len(ids))], 4)
    caches = model.allocate_kv_caches(-(-len(ids) // 4) + 1, 4)
    if model.can_scan():
        params, caches = model.stack_params(params), model.stack_kv_caches(caches)
    hidden, _ = jax.jit(model.forward)(params, caches, jnp.asarray(ids, jnp.int32), meta)
    return np.asarray(jax.jit(model.compute_logits)(params, hidden))


def _assert_close(ours, ref, what):
    tol = TOL * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours - ref).max())
    assert np.isfinite(ours).all() and err <= tol, f"{what}: max |diff| {err:.3g} > {tol:.3g}"


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    """(resolved, float model, float params) of the default model, dequantized at load."""
    resolved = models.resolve_model(smollm2_gguf)
    m, p = models.load_model(resolved=resolved, dtype="float32")
    return resolved, m, p


IDS = [1, 504, 3458, 314, 260, 1345, 282, 253, 3012, 30, 198, 37]


def test_gguf_kept_quantized_memory_and_logits(smollm2):
    resolved, m_f, p_f = smollm2
    m_q, p_q = models.load_model(resolved=resolved, dtype="float32", quantization="gguf")
    kinds = set(m_q.quantized.values())
    assert kinds == {"q4_1", "q8_0"}  # the file's layer and embedding formats
    reader = pagedjax.models.loader.gguf_reader(f"{resolved.path}/{resolved.gguf_file}")
    file_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    ours = models.model_weight_bytes(p_q)
    assert abs(ours - file_bytes) <= 0.10 * file_bytes, (ours, file_bytes)
    assert models.model_weight_bytes(p_f) > 3 * ours
    _assert_close(_logits(m_q, p_q, IDS), _logits(m_f, p_f, IDS), "gguf kept vs dequantized")


def test_int8_memory_and_logits(smollm2):
    resolved, m_f, p_f = smollm2
    m_q, p_q = models.load_model(resolved=resolved, dtype="float32", quantization="int8")
    assert set(m_q.quantized.values()) == {"int8"}
    f32 = models.model_weight_bytes(p_f)
    ours = models.model_weight_bytes(p_q)
    assert abs(ours - f32 / 4) <= 0.10 * f32 / 4, (ours, f32)
    got = _logits(m_q, p_q, IDS)
    deq = dequantized_reference(m_q, p_q)
    _assert_close(got, _logits(m_f, deq, IDS), "int8 vs its floats")
    long = IDS * 6  # 72 rows: more than Q.CHUNK_MAX_ROWS, whole weights dequantized
    assert len(long) > Q.CHUNK_MAX_ROWS
    _assert_close(_logits(m_q, p_q, long), _logits(m_f, deq, long), "int8, many rows")
    ref = _logits(m_f, p_f, IDS)  # the float model itself: quantization error, not asserted tight
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


def test_bad_quantization_values(smollm2, tmp_path):
    resolved, _, _ = smollm2
    with pytest.raises(ValueError, match="quantization"):
        models.load_model(resolved=resolved, quantization="int4")


def test_kquants_through_a_model(tmp_path):
    """A tiny Llama GGUF with Q4_K attention, Q6_K MLP and a Q4_0 embedding: kept
    quantized, the logits equal those of the same file dequantized at load."""
    rng = np.random.default_rng(4)
    kinds = dict.fromkeys(gguf_models.LAYER[:4], "q4_k") | dict.fromkeys(gguf_models.LAYER[4:],
                                                                          "q6_k")
    path = gguf_models.write_llama_gguf(str(tmp_path / "k.gguf"), kinds, "q4_0", rng)
    vocab = 96
    m_f, p_f = models.load_model(path, dtype="float32")
    m_q, p_q = models.load_model(path, dtype="float32", quantization="gguf")
    assert set(m_q.quantized.values()) == {"q4_0", "q4_k", "q6_k"}
    ids = [int(i) for i in rng.integers(0, vocab, 9)]
    _assert_close(_logits(m_q, p_q, ids), _logits(m_f, p_f, ids), "k-quants kept vs dequantized")
    file_bytes = sum(int(t.n_bytes) for t in pagedjax.models.loader.gguf_reader(path).tensors)
    assert abs(models.model_weight_bytes(p_q) - file_bytes) <= 0.10 * file_bytes
