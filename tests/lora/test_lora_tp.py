"""LoRA under tensor parallelism on 2 fake CPU devices: TP=2 gives TP=1's tokens.

A batch mixing three PEFT adapters and the base model runs at TP=1 and TP=2
(each in a fresh ``python tests/lora/test_lora_tp.py '<json>'`` subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=2``, as in
tests/distributed/test_parallel.py). Asserted here: identical greedy tokens, every top-5
logprob within 1e-4 of TP=1 (float32), the adapters change the tokens, no
pages held afterwards, and the slot tables sharded like their base weights:
A ``[N, In, R]`` on the input axis where the base kernel splits its input
(o_proj, down_proj: row parallel), B ``[N, R, *Out]`` on the output axis where
it splits its output (q/k/v by KV head, gate/up by the MLP axis).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from tests.utils.paths import REPO, REPO_ROOT  # noqa: F401

ROOT = REPO
NUM_DEVICES = 2
LOGPROB_ATOL = 1e-4
WHICH = [0, 1, 2, 3, 1, 0, 3, 2]  # base + three adapters, interleaved
MAX_TOKENS = 8


# ----------------------------------------------------------------------------- subprocess side


def _generate(base: str, adapters: dict, tp: int) -> dict:
    import numpy as np

    from pagedjax import LLM, LoRARequest, SamplingParams
    from pagedjax.distributed.sharding import path_str

    llm = LLM(base, tensor_parallel_size=tp, dtype="float32", page_size=4, max_model_len=64,
              max_num_seqs=4, max_num_batched_tokens=32, num_pages=40, seed=0,
              enable_lora=True, max_loras=3, max_lora_rank=8)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 96, int(rng.integers(3, 20)))] for _ in WHICH]
    prompts[1:4] = [prompts[0]] * 3  # one prompt under the base model and each adapter
    loras = [None if i == 0 else LoRARequest(f"a{i}", i, adapters[str(i)]) for i in WHICH]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    eng = llm.llm_engine
    import jax

    flat = jax.tree_util.tree_flatten_with_path(eng.runner.params)[0]
    specs = {path_str(p): str(getattr(a.sharding, "spec", None))
             for p, a in flat if "lora" in path_str(p)}
    return {
        "tokens": [o.outputs[0].token_ids for o in outs],
        "logprobs": [[{str(t): v.logprob for t, v in d.items()} for d in o.outputs[0].logprobs]
                     for o in outs],
        "lora_specs": specs,
        "pages_used": eng.pool_stats().used,
        "device_count": jax.device_count(),
    }


# ----------------------------------------------------------------------------- pytest side


def run_isolated(spec: dict) -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={NUM_DEVICES}"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"subprocess failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print(json.dumps(_generate(spec["base"], spec["adapters"], spec["tp"])), flush=True)
    sys.exit(0)


import pytest  # noqa: E402  (pytest side only)

pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama (4 heads, 2 KV heads: TP=2 divides) with a word-level
    tokenizer, and three PEFT adapters of ranks 2, 4, 8 on every q/k/v/o/MLP projection."""
    from tests.utils.lora import make_adapter, tiny_hf_model
    from tests.distributed.test_parallel import save_tiny_tokenizer

    root = tmp_path_factory.mktemp("lora_tp")
    base = tiny_hf_model("llama", vocab=96, seed=3)
    base.save_pretrained(root / "base")
    save_tiny_tokenizer(str(root / "base"), 96)
    adapters = {}
    for i, r in zip((1, 2, 3), (2, 4, 8)):
        make_adapter(base, str(root / f"a{i}"), seed=200 + i, r=r, alpha=2 * r)
        adapters[str(i)] = str(root / f"a{i}")
    return str(root / "base"), adapters


def test_lora_tp2_matches_tp1(tiny):
    base, adapters = tiny
    one = run_isolated({"base": base, "adapters": adapters, "tp": 1})
    two = run_isolated({"base": base, "adapters": adapters, "tp": 2})
    assert two["device_count"] == NUM_DEVICES
    assert two["tokens"] == one["tokens"], "TP=2 greedy tokens differ from TP=1"
    worst = 0.0
    for ra, rb in zip(one["logprobs"], two["logprobs"]):
        for a, b in zip(ra, rb):
            common = set(a) & set(b)
            assert len(common) >= 5, f"top-5 token sets differ: {sorted(a)} vs {sorted(b)}"
            worst = max([worst] + [abs(a[t] - b[t]) for t in common])
    assert worst <= LOGPROB_ATOL, f"logprob max |diff| {worst:.3g} > {LOGPROB_ATOL}"
    # The adapters matter: one prompt gives four different outputs (base, a1, a2, a3).
    assert len({tuple(t) for t in one["tokens"][:4]}) == 4
    assert one["pages_used"] == 0 and two["pages_used"] == 0

    specs = two["lora_specs"]
    tp = "'tp'"

    def spec(suffix):
        (hit,) = [v for k, v in specs.items() if k.endswith(suffix) and "layers/0/" in k]
        return hit

    # Column-parallel projections: A replicated (input = embed), B split on the output axis.
    assert tp not in spec("attn/qkv_proj/lora/a") and tp not in spec("mlp/gate_up/lora/a")
    assert spec("attn/qkv_proj/lora/b") == f"P(None, None, {tp}, None, None)"
    assert spec("mlp/gate_up/lora/b") == f"P(None, None, None, {tp})"
    # Row-parallel projections: A split on the input axis, B replicated (output = embed).
    assert spec("attn/o_proj/lora/a") == f"P(None, {tp}, None)"
    assert spec("mlp/down/lora/a") == f"P(None, {tp}, None)"
    assert tp not in spec("attn/o_proj/lora/b") and tp not in spec("mlp/down/lora/b")
