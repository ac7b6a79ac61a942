"""Mixture-of-experts under a mesh of 4 forced CPU devices: expert parallelism
(``enable_expert_parallel=True``: whole experts per device) and tensor parallelism
(each expert's intermediate size split) at sizes 1, 2 and 4 give the same greedy
tokens and logprobs as one device, which gives transformers' greedy tokens.

Runs in a subprocess, as tests/distributed/test_parallel.py explains.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.distributed.test_parallel import (  # noqa: E402
    MAX_TOKENS,
    PROMPTS,
    _assert_same,
    run_isolated,
    save_tiny_tokenizer,
)
from tests.models.test_models import _randomize  # noqa: E402

VOCAB = 96


def _config(name: str):
    T = transformers
    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
                  num_hidden_layers=2)
    if name == "qwen3_moe":
        return T.Qwen3MoeConfig(**common, intermediate_size=64, moe_intermediate_size=32,
                                num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
    if name == "mixtral":
        return T.MixtralConfig(**common, intermediate_size=32, num_local_experts=4,
                               num_experts_per_tok=2)
    return T.Qwen3MoeConfig(**common, intermediate_size=64, moe_intermediate_size=16,
                            num_experts=6, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            torch.manual_seed(0)
            hf = transformers.AutoModelForCausalLM.from_config(_config(name))
            _randomize(hf, seed=len(name))
            hf.eval()
            folder = str(tmp_path_factory.mktemp(f"ep_{name}"))
            hf.save_pretrained(folder)
            save_tiny_tokenizer(folder, VOCAB)
            cache[name] = (hf, folder)
        return cache[name]

    return get


def _hf_greedy(hf, prompts=PROMPTS, n=MAX_TOKENS):
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = hf.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False)
            out.append(ids[0, len(p):].tolist())
    return out


def _expert_paths(paths):
    return [p for p in paths if "experts_" in p]


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_expert_parallel_matches_one_device(moe_folder, name):
    hf, folder = moe_folder(name)
    ep = run_isolated({"kind": "generate", "model": folder, "tps": [1, 2, 4],
                       "enable_expert_parallel": True})
    base = ep["1"]
    assert base["tokens"] == _hf_greedy(hf)
    for tp in (2, 4):
        run = ep[str(tp)]
        _assert_same(base, run, f"{name} EP={tp}")
        assert not _expert_paths(run["replicated"]), run["replicated"]
        (w1,) = base["weights"].values()
        assert all(w < 0.75 * w1 for w in run["weights"].values()), run["weights"]


def test_tensor_parallel_experts_match_one_device(moe_folder):
    hf, folder = moe_folder("qwen3_moe")
    runs = run_isolated({"kind": "generate", "model": folder, "tps": [1, 2, 4]})
    for tp in (2, 4):
        _assert_same(runs["1"], runs[str(tp)], f"qwen3_moe TP={tp}")
        assert not _expert_paths(runs[str(tp)]["replicated"])


def test_experts_not_divisible_by_ep_size(moe_folder):
    import pagedjax.models as models
    from jax.sharding import PartitionSpec as P

    from pagedjax.distributed.sharding import check_expert_parallel, logical_spec

    _, folder = moe_folder("six_experts")
    model = models.build_model(models.resolve_model(folder), "float32")
    check_expert_parallel(model, 2)
    check_expert_parallel(model, 3)
    with pytest.raises(ValueError, match="num_experts=6 is not divisible by the "
                                         "expert-parallel size 4.*use tensor_parallel_size in 1, 2"):
        check_expert_parallel(model, 4)
    axes = ("experts", "embed", None, "mlp")
    assert logical_spec(axes, (8, 64, 2, 32), 4, expert_parallel=True) == P("tp", None, None, None)
    assert logical_spec(axes, (8, 64, 2, 32), 4) == P(None, None, None, "tp")
