"""Tensor parallelism on 4 fake CPU devices: TP=2 and TP=4 give TP=1's tokens.

Every check runs in a fresh ``python tests/distributed/test_parallel.py '<json>'``
subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``: the
flag only works before JAX starts, and under pytest-xdist another test module
may already have started JAX in this process. The subprocess prints one JSON
line; the assertions run here.

Tolerance: greedy tokens identical; every top-5 logprob (log-softmax of the
logits, generated and prompt positions) within LOGPROB_ATOL of TP=1 (float32;
row-parallel layers only change the order of one reduction).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from tests.utils.paths import REPO, REPO_ROOT  # noqa: F401

ROOT = REPO
NUM_DEVICES = 4
LOGPROB_ATOL = 1e-4
PROMPTS = [[5, 17, 33, 2, 71, 8, 9, 40, 11], [60, 3, 3, 90, 14], [7] * 13 + [22, 23]]
MAX_TOKENS = 10


# ----------------------------------------------------------------------------- subprocess side


def _generate(model, tp, tokenizer=None, prompts=PROMPTS, max_tokens=MAX_TOKENS, **kw):
    import jax

    from pagedjax import LLM, SamplingParams
    from pagedjax.distributed import sharding

    t0 = time.perf_counter()
    llm = LLM(model, tokenizer=tokenizer, tensor_parallel_size=tp, dtype="float32",
              page_size=4, max_model_len=64, max_num_seqs=4, seed=0, **kw)
    eng = llm.llm_engine
    weights = sharding.bytes_per_device(eng.params)
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5,
                             prompt_logprobs=5 if i == 0 else None) for i in range(len(prompts))]
    outs = llm.generate(prompts, params, use_tqdm=False)
    kv = sharding.bytes_per_device(eng.runner.kv_caches)
    kv_specs = sorted({str(getattr(pages.sharding, "spec", None)) for pages, _ in eng.runner.kv_caches})

    def lp(d):
        return {str(t): v.logprob for t, v in d.items()} if d is not None else None

    return {
        "tokens": [o.outputs[0].token_ids for o in outs],
        "logprobs": [[lp(d) for d in o.outputs[0].logprobs] for o in outs],
        "prompt_logprobs": [lp(d) for d in outs[0].prompt_logprobs],
        "weights": weights, "kv": kv, "kv_specs": kv_specs,
        "backend": eng.runner.attn_backend,
        "mesh_devices": [] if eng.mesh is None else [int(d.id) for d in eng.mesh.devices.flat],
        "replicated": _replicated_paths(eng.params) if tp > 1 else [],
        "seconds": time.perf_counter() - t0,
        "device_count": jax.device_count(),
    }


def _replicated_paths(params):
    import jax

    from pagedjax.distributed.sharding import path_str

    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return sorted({path_str(p) for p, a in flat if a.sharding.is_fully_replicated})


def _errors(model):
    from pagedjax import LLM

    out = {}
    for tp in (3, 8):
        try:
            LLM(model, tensor_parallel_size=tp, num_pages=8, max_model_len=32)
            out[str(tp)] = None
        except ValueError as e:
            out[str(tp)] = str(e)
    return out


def _sharded_pallas(backend):
    """kernels_pallas.sharded_attention(pallas kernel, interpret mode) vs the unsharded reference."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pagedjax.kernels_pallas as kernels_pallas
    from pagedjax.distributed import sharding

    rng = np.random.default_rng(0)
    hkv, g, d, ps, npages = 4, 2, 16, 4, 12
    lens = [5, 1, 9]
    qlens = [5, 1, 3]
    t = sum(qlens)
    q = jnp.asarray(rng.standard_normal((t, hkv * g, d)), jnp.float32)
    kv = jnp.asarray(rng.standard_normal((npages, 2, hkv, ps, d)), jnp.float32)
    table = np.zeros((3, 4), np.int32)
    perm = rng.permutation(np.arange(1, npages))
    k = 0
    for i, n in enumerate(lens):
        for j in range(-(-n // ps)):
            table[i, j] = perm[k]
            k += 1
    cu = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    args = (q, kv, jnp.asarray(lens, jnp.int32), jnp.asarray(table), jnp.asarray(cu),
            jnp.int32(3))
    ref = kernels_pallas.ragged_paged_attention(*args, sm_scale=d**-0.5, backend="xla")
    out = {}
    for tp in (2, 4):
        mesh = sharding.make_mesh(tp)
        attn = kernels_pallas.sharded_attention(mesh)
        got = jax.jit(lambda *a: attn(*a, sm_scale=d**-0.5, backend=backend, interpret=True))(*args)
        out[str(tp)] = {"err": float(jnp.max(jnp.abs(got - ref))),
                        "spec": str(got.sharding.spec)}
    return out


def _main(spec: dict) -> dict:
    kind = spec.pop("kind")
    for module in spec.pop("imports", []):  # e.g. a custom model's @register_model
        importlib.import_module(module)
    if kind == "generate":
        runs = {}
        for tp in spec.pop("tps"):
            runs[str(tp)] = _generate(tp=tp, **spec)
        return runs
    if kind == "errors":
        return _errors(spec["model"])
    if kind == "sharded_pallas":
        return _sharded_pallas(spec["backend"])
    raise ValueError(kind)


# ----------------------------------------------------------------------------- pytest side


def run_isolated(spec: dict, num_devices: int = NUM_DEVICES, timeout: float = 900) -> dict:
    """Run ``_main(spec)`` in a subprocess with ``num_devices`` CPU devices."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={num_devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"subprocess failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def save_tiny_tokenizer(folder: str, vocab_size: int) -> None:
    """A word-level tokenizer ("w0".."w{V-1}") so an HF folder loads as a whole."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", eos_token="w2",
                            bos_token="w1").save_pretrained(folder)


def _assert_same(base: dict, other: dict, what: str) -> None:
    assert other["tokens"] == base["tokens"], f"{what}: greedy tokens differ"
    pairs = [(a, b) for ra, rb in zip(base["logprobs"], other["logprobs"]) for a, b in zip(ra, rb)]
    pairs += list(zip(base["prompt_logprobs"], other["prompt_logprobs"]))
    worst = 0.0
    for a, b in pairs:
        if a is None:
            assert b is None
            continue
        common = set(a) & set(b)
        assert len(common) >= 5, f"{what}: top-5 token sets differ: {sorted(a)} vs {sorted(b)}"
        worst = max([worst] + [abs(a[t] - b[t]) for t in common])
    assert worst <= LOGPROB_ATOL, f"{what}: logprob max |diff| {worst:.3g} > {LOGPROB_ATOL}"


def _assert_memory(base: dict, run: dict, tp: int, what: str) -> None:
    """Weights and KV pool: each device holds about 1/tp of the TP=1 bytes."""
    (w1,) = base["weights"].values()
    (kv1,) = base["kv"].values()
    assert len(run["weights"]) == tp and len(run["kv"]) == tp, run["weights"]
    for dev, kv in run["kv"].items():
        assert kv * tp == kv1, f"{what}: device {dev} holds {kv} KV bytes, want {kv1 // tp}"
    for dev, w in run["weights"].items():
        assert w <= 1.1 * w1 / tp + 0.08 * w1, f"{what}: device {dev} holds {w} of {w1} weight bytes"
    # Only small parameters may be replicated: norms, biases, learned positions.
    allowed = ("norm", "ln_", "layernorm", "bias", "embed_positions", "project_in", "project_out")
    bad = [p for p in run["replicated"] if not any(k in p for k in allowed)]
    assert not bad, f"{what}: replicated large parameters {bad}"


if __name__ == "__main__":
    result = _main(json.loads(sys.argv[1]))
    print(json.dumps(result), flush=True)
    sys.exit(0)


import pytest  # noqa: E402  (pytest side only: the subprocess never needs it)

from tests.models.test_models import ARCHS, VOCAB  # noqa: E402


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """arch -> an HF folder (config, safetensors, tokenizer) of a tiny random model."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    from tests.models.test_models import _randomize, _tiny_configs

    cache = {}

    def get(arch):
        if arch not in cache:
            cfg = _tiny_configs()[arch]()
            if getattr(cfg, "num_key_value_heads", None):  # 4 KV heads so that TP=4 divides
                cfg.num_attention_heads, cfg.num_key_value_heads = 8, 4
                cfg.head_dim = getattr(cfg, "head_dim", None) or 8
            if arch == "phi3":  # LongRoPE factors: one per rotary pair of the new head size
                d = cfg.hidden_size // cfg.num_attention_heads
                for k in ("short_factor", "long_factor"):
                    cfg.rope_parameters[k] = cfg.rope_parameters[k][: d // 2]
            torch.manual_seed(0)
            hf = transformers.AutoModelForCausalLM.from_config(cfg)
            _randomize(hf, seed=len(arch))
            folder = str(tmp_path_factory.mktemp(f"tp_{arch}"))
            hf.save_pretrained(folder)
            save_tiny_tokenizer(folder, VOCAB)
            cache[arch] = folder
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_tp_matches_single_device(tiny_folder, arch):
    runs = run_isolated({"kind": "generate", "model": tiny_folder(arch), "tps": [1, 2, 4]})
    print({tp: round(r["seconds"], 1) for tp, r in runs.items()})
    base = runs["1"]
    assert base["device_count"] == NUM_DEVICES
    for tp in (2, 4):
        run = runs[str(tp)]
        assert run["mesh_devices"] == list(range(tp))
        assert run["kv_specs"] == ["P(None, None, 'tp', None, None)"]
        _assert_same(base, run, f"{arch} TP={tp}")
        _assert_memory(base, run, tp, f"{arch} TP={tp}")


def test_default_model_tp3(smollm2_gguf):
    """SmolLM2 has 3 KV heads: TP=3 on the first 3 of 4 devices, text prompts. Float
    weights at both sizes (on one CPU device a GGUF file may keep its blocks by
    default, which TP does not: the memory check compares like with like)."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    runs = run_isolated({"kind": "generate", "model": smollm2_gguf, "tps": [1, 3],
                         "prompts": prompts, "max_tokens": 8, "quantization": "none"})
    assert runs["3"]["mesh_devices"] == [0, 1, 2]
    _assert_same(runs["1"], runs["3"], "SmolLM2 TP=3")
    _assert_memory(runs["1"], runs["3"], 3, "SmolLM2 TP=3")


def test_clear_errors(tiny_folder):
    errs = run_isolated({"kind": "errors", "model": tiny_folder("llama")})
    assert "tensor_parallel_size=3 does not divide the model's num_kv_heads=4" in errs["3"]
    assert "use one of 1, 2, 4" in errs["3"]
    assert "tensor_parallel_size=8 exceeds the 4 available cpu device(s)" in errs["8"]


def test_tp_pallas_kernel_through_shard_map(tiny_folder):
    """An explicit Pallas backend under TP runs per device (shard_map over KV heads,
    interpret mode here) and gives TP=1's greedy tokens and logprobs."""
    folder = tiny_folder("llama")
    base = run_isolated({"kind": "generate", "model": folder, "tps": [1], "max_tokens": 4})["1"]
    run = run_isolated({"kind": "generate", "model": folder, "tps": [2], "max_tokens": 4,
                        "attention_backend": "pallas_gpu"})["2"]
    assert run["backend"] == "pallas_gpu"
    _assert_same(base, run, "llama TP=2 pallas_gpu")


@pytest.mark.parametrize("backend", ["pallas_gpu"])
def test_sharded_pallas_attention_interpret(backend):
    """The shard_map wrapper runs the Pallas kernel per device on its heads."""
    res = run_isolated({"kind": "sharded_pallas", "backend": backend})
    for tp in ("2", "4"):
        assert res[tp]["err"] <= 1e-5, res
        assert res[tp]["spec"] in ("P(None, 'tp')", "P(None, 'tp', None)"), res
