"""Published quantized checkpoints kept quantized (models/checkpoint_quant.py).

Tiny random Llamas are written here in each format's documented layout
(tests/utils/quant_checkpoints.py): AWQ GEMM, GPTQ (sym / asym, the "gptq"
zero-minus-one and "gptq_v2" formats, act-order), FP8 per channel and per
tensor (compressed-tensors) and in blocks (the fp8 method). For each:

* the loaded model keeps every projection quantized (its kind, its packed bytes:
  4 bits a weight + an f32 scale and a u8 zero per group; fp8 one byte + scales);
* its logits equal transformers' on the same weights dequantized by the test's own
  numpy reader within 2e-4 * max(1, max|logit|) (only the order of float sums
  differs: every kind's values are exact in float32), on the C++ block kernel's
  path (few rows) and the jnp path (more rows), and transformers' greedy
  continuation is our argmax at every step;
* compressed-tensors FP8 loads in transformers itself (the compressed-tensors
  package decompresses it on the CPU): the same comparison against that model;
* unsupported variants fail at load naming what is supported.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pagedjax.models as models  # noqa: E402
from pagedjax.models import quant as Q  # noqa: E402
from pagedjax.models.base import ExecutionPlan  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402
from tests.utils import quant_checkpoints as qc  # noqa: E402

TOL = 2e-4
PROMPT = [1, 17, 300, 41, 99, 7]
FORMATS = {
    "awq_g32": ("awq", {"group": 32}),
    "gptq_sym_v1_g32": ("gptq", {"group": 32, "sym": True, "v1": True}),
    "gptq_asym_v2_g64": ("gptq", {"group": 64, "sym": False, "v1": False}),
    "gptq_asym_v1_actorder": ("gptq", {"group": 32, "sym": False, "v1": True, "desc_act": True}),
    "gptq_per_channel": ("gptq", {"group": -1, "sym": True, "v1": False}),
    "fp8_channel_ct": ("fp8_ct", {"strategy": "channel"}),
    "fp8_tensor_ct": ("fp8_ct", {"strategy": "tensor"}),
    "fp8_block": ("fp8_block", {"block": (32, 32)}),
    "fp8_channel_ct_w8a16": ("fp8_ct", {"strategy": "channel", "weight_only": True}),
}


@pytest.fixture(scope="module")
def hf_model():
    return qc.tiny_llama(seed=0)


def write(hf_model, tmp_path_factory, name):
    fmt, kw = FORMATS[name]
    folder = tmp_path_factory.mktemp(name)
    qc.save_quantized(hf_model, str(folder), fmt, **kw)
    return str(folder)


def reference_model(hf_model, folder):
    """transformers' Llama with the checkpoint's weights as the test's numpy reader
    dequantizes them."""
    import copy

    ref = copy.deepcopy(hf_model)
    weights = qc.dequantize_folder(folder)
    missing, unexpected = ref.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()},
                                              strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return ref


def hf_greedy(ref, n: int = 8) -> tuple[list[int], np.ndarray]:
    """transformers' greedy continuation of PROMPT and its teacher-forced logits."""
    with torch.no_grad():
        out = ref.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False,
                           pad_token_id=0)
        ids = out[0].tolist()
        logits = ref(torch.tensor([ids])).logits[0].numpy()
    return ids, logits


def our_logits(model, params, ids, plan=None):
    meta = build_metadata([SeqChunk(list(range(1, 1 + -(-len(ids) // 4))), 0, len(ids))], 4)
    caches = model.allocate_kv_caches(-(-len(ids) // 4) + 1, 4)
    if model.can_scan():
        params, caches = model.stack_params(params), model.stack_kv_caches(caches)
    kw = {} if plan is None else {"plan": plan}
    hidden, _ = jax.jit(lambda p, c, t, m: model.forward(p, c, t, m, **kw))(
        params, caches, jnp.asarray(ids, jnp.int32), meta)
    return np.asarray(jax.jit(lambda p, h: model.compute_logits(p, h, **kw))(params, hidden))


def assert_close(ours, ref, what):
    tol = TOL * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours - ref).max())
    assert np.isfinite(ours).all() and err <= tol, f"{what}: max |diff| {err:.3g} > {tol:.3g}"


def expected_bytes(kind: str, n_in: int, n_out: int) -> int:
    """The packed bytes of one [n_in, n_out] weight of ``kind``."""
    if kind == "fp8":
        return n_in * n_out + 4 * n_out
    base, g, perm = Q.parse_kind(kind)
    if base == "fp8":
        return n_in * n_out + 4 * n_in // g * n_out
    return n_in * n_out // 2 + 5 * n_in // g * n_out + (4 * n_in if perm else 0)


def check_memory(model, params, name):
    from flax import nnx

    flat = dict(nnx.traversals.flatten_mapping(params))
    projections = 0
    for path, kind in model.quantized.items():
        comps = {c: flat[path + (c,)] for c in Q.formats(kind)}
        first = comps[next(iter(comps))]
        n_in = first.shape[0] * Q.formats(kind)[next(iter(comps))][1]
        n_out = int(np.prod(first.shape[1:]))
        got = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in comps.values())
        assert got == expected_bytes(kind, n_in, n_out), (name, path, kind, got)
        projections += 1
    assert projections == 2 * 4  # qkv, o, gate_up, down in each of 2 layers


SLOW = ("gptq_per_channel", "fp8_tensor_ct")  # variants of a layout the others cover


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in FORMATS if not n.endswith("w8a16")])
def test_kept_quantized_matches_transformers_on_dequantized_weights(
        hf_model, tmp_path_factory, name):
    folder = write(hf_model, tmp_path_factory, name)
    m, p = models.load_model(folder, dtype="float32")
    kinds = set(m.quantized.values())
    want = {"awq": "int4_g", "gptq": "int4_g", "fp8_ct": "fp8", "fp8_block": "fp8_g32"}
    assert kinds and all(k.startswith(want[FORMATS[name][0]]) for k in kinds), kinds
    if FORMATS[name][1].get("desc_act"):
        assert all(k.endswith("_perm") for k in kinds)
    check_memory(m, p, name)
    ids, ref_logits = hf_greedy(reference_model(hf_model, folder))
    ours = our_logits(m, p, ids)
    assert_close(ours, ref_logits, name)
    n = len(PROMPT)
    assert ours[n - 1:-1].argmax(-1).tolist() == ids[n:], name  # greedy tokens
    if kinds <= {k for k in kinds if Q.block_kernel_kind(k)}:  # the C++ block kernel's path
        from pagedjax.kernels_pallas.cpu import blockmatmul

        if blockmatmul.available():
            plan = ExecutionPlan(attn_backend="xla", block_matmul_rows=64)
            assert_close(our_logits(m, p, ids, plan), ref_logits, name + " (C++ kernel)")


def test_compressed_tensors_fp8_matches_transformers_loading_it(hf_model, tmp_path_factory):
    """transformers reads compressed-tensors FP8 itself (decompressed on the CPU); the
    weight-only scheme (W8A16: pagedjax keeps activations float, where FP8_DYNAMIC
    checkpoints would also round each token's activations to fp8)."""
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    folder = write(hf_model, tmp_path_factory, "fp8_channel_ct_w8a16")
    ref = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids, ref_logits = hf_greedy(ref)
    m, p = models.load_model(folder, dtype="float32")
    assert set(m.quantized.values()) == {"fp8"}
    ours = our_logits(m, p, ids)
    assert_close(ours, ref_logits, "compressed-tensors via transformers")
    assert ours[len(PROMPT) - 1:-1].argmax(-1).tolist() == ids[len(PROMPT):]


def test_quantization_none_dequantizes_at_load(hf_model, tmp_path_factory):
    folder = write(hf_model, tmp_path_factory, "awq_g32")
    m_q, p_q = models.load_model(folder, dtype="float32")
    m_f, p_f = models.load_model(folder, dtype="float32", quantization="none")
    assert not m_f.quantized and m_q.quantized
    from flax import nnx

    flat_q, flat_f = (dict(nnx.traversals.flatten_mapping(p)) for p in (p_q, p_f))
    for path, kind in m_q.quantized.items():  # 32 bits a weight vs 4 + 40 / 32
        packed = sum(flat_q[path + (c,)].nbytes for c in Q.formats(kind))
        assert flat_f[path].dtype == jnp.float32 and flat_f[path].nbytes >= 6 * packed, path
    assert_close(our_logits(m_q, p_q, PROMPT), our_logits(m_f, p_f, PROMPT), "none")
    with pytest.raises(ValueError, match="quantization='gptq' needs a checkpoint.*awq"):
        models.load_model(folder, dtype="float32", quantization="gptq")


@pytest.mark.parametrize("config, match", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "awq version"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "exllama"}, "awq version"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "gptq with bits=3"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
     "checkpoint_format='marlin'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 16}, "group_size=16"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int"}}}}, "int-quantized"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}}, "pack-quantized"),
    ({"quant_method": "bitsandbytes"}, "bitsandbytes"),
])
def test_unsupported_variants_fail_at_load_naming_the_supported(hf_model, tmp_path_factory,
                                                                config, match):
    import json
    import os

    folder = write(hf_model, tmp_path_factory, "awq_g32")
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = config
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=f"(?s){match}.*pagedjax reads fp8 .*awq .*gptq"):
        models.load_model(folder, dtype="float32")


@pytest.mark.parametrize("name", ["gptq_asym_v1_actorder",
                                  pytest.param("fp8_block", marks=pytest.mark.slow)])
def test_tensor_parallel_2_equals_1(hf_model, tmp_path_factory, smollm2_gguf, name):
    """TP=2 on two forced CPU devices gives TP=1's greedy tokens and logprobs (the
    groups of o_proj's and down's inputs split whole between the devices; act-order's
    permutation gathers the activation columns across them). TP=1 runs the engine's
    default CPU backend: int4 groups in the C++ block kernel where measured to pay."""
    import json
    import os
    import subprocess
    import sys

    from tests.utils.paths import REPO_ROOT

    folder = write(hf_model, tmp_path_factory, name)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=2"])
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "tests.distributed.tp_quant_child", folder,
                           smollm2_gguf], capture_output=True, text=True, env=env,
                          cwd=str(REPO_ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    one, two = out["1"], out["2"]
    assert one["kinds"] == two["kinds"] and one["kinds"][0].startswith(("int4_g", "fp8_g"))
    assert one["tokens"] == two["tokens"]
    np.testing.assert_allclose(two["logprobs"], one["logprobs"], atol=1e-3)


def test_tensor_parallel_needs_whole_groups(hf_model, tmp_path_factory):
    """o_proj's 64 inputs in 2 groups of 32 cannot be split between 4 devices: the
    error names the sizes; per-channel scales (one group) split anywhere."""
    from pagedjax.distributed import sharding
    from pagedjax.models import loader, weights

    for name, ok in (("awq_g32", False), ("gptq_per_channel", True)):
        folder = write(hf_model, tmp_path_factory, name)
        m = models.build_model(models.resolve_model(folder), "float32")
        m = m.with_quantization(weights.choose_quantization(m, loader.open_hf_folder(folder),
                                                            None))
        if ok:
            sharding.check_quantized_groups(m, 4)
            continue
        with pytest.raises(ValueError, match="tensor_parallel_size=4: .*o_proj.* 2 groups "
                                             "along its 64 inputs.*divides 2"):
            sharding.check_quantized_groups(m, 4)


def _random_components(kind: str, n_in: int, n_out: int, rng) -> dict:
    """Components [In_c, Out] of ``kind`` with random codes and scales."""
    base, g, perm = Q.parse_kind(kind) if kind != "fp8" else ("fp8", 0, False)
    if base == "fp8":
        q = (rng.standard_normal((n_in, n_out)) * 50).astype(np.float32)
        comps = {"q": q.astype(jnp.float8_e4m3fn)}
        if g:
            comps["s"] = rng.uniform(0.001, 0.01, (n_in // g, n_out)).astype(np.float32)
        else:
            comps["scale"] = rng.uniform(0.001, 0.01, n_out).astype(np.float32)
        return comps
    comps = {"qs": rng.integers(0, 256, (n_in // 2, n_out)).astype(np.uint8),
             "s": rng.uniform(-0.05, 0.05, (n_in // g, n_out)).astype(np.float32),
             "z": rng.integers(0, 17, (n_in // g, n_out)).astype(np.uint8)}
    if perm:
        comps["perm"] = rng.permutation(n_in).astype(np.int32)
    return comps


@pytest.mark.parametrize("kind", ["int4_g32", "int4_g128_perm", "fp8", "fp8_g64"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_step_matmul_paths_equal_dequantize_then_dot(kind, dtype):
    """models/nn.py's qmatmul for the checkpoint kinds: chunks of whole groups dequantized
    inside a scan (few rows), a whole dequantization (many rows, as under TP), act-order's
    gather of x, in float32 and in bfloat16 (the GPU/TPU model dtype) -- against the
    logical weight (perm undone) dequantized and dotted in float64."""
    from pagedjax.models import nn

    rng = np.random.default_rng(3)
    n_in, n_out = 1024, 96  # 1024 x 96 f32 > 256 KiB: several chunks
    comps = _random_components(kind, n_in, n_out, rng)
    w = np.asarray(Q.dequantize(kind, {k: jnp.asarray(v) for k, v in comps.items()}, 0,
                                jnp.float32), np.float64)
    weight = nn.QuantizedWeight(kind, (n_in, n_out), ("mlp", "embed"), 0)
    for name, v in comps.items():
        getattr(weight, name)[...] = jnp.asarray(v)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for rows in (3, Q.CHUNK_MAX_ROWS + 5):
        x = rng.standard_normal((rows, n_in)).astype(np.float32)
        got = jax.jit(lambda x: nn.qmatmul(x, weight, ExecutionPlan()))(
            jnp.asarray(x, dtype))
        ref = x.astype(np.float64) @ w
        bound = tol * (np.abs(x) @ np.abs(w)).max()
        assert got.dtype == jnp.dtype(dtype)
        assert np.abs(np.asarray(got, np.float64) - ref).max() <= bound, (kind, rows)
