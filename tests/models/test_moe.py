"""Mixture-of-experts models against transformers' PyTorch models on tiny random configs:
Qwen3-MoE (top-2 without renormalisation, with a dense layer between sparse ones; top-8
of 16 renormalised), Qwen2-MoE (shared expert) and Mixtral. Logits through a NaN-filled
shuffled page pool (one prefill, two prefill chunks then decodes), every grouped-matmul
implementation, and greedy tokens through the engine with preemption.

Tolerance as in test_models.py (float32).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pagedjax.models as models  # noqa: E402
from pagedjax.kernels_pallas.grouped_matmul import dense_all_experts, grouped_matmul  # noqa: E402
from pagedjax.models.base import ExecutionPlan  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402
from tests.models.test_models import PagedRunner, _randomize, assert_close, hf_logits  # noqa: E402

VOCAB = 96


def moe_configs():
    T = transformers
    attn = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64, tie_word_embeddings=False)
    return {
        "qwen3_moe_top2": lambda: T.Qwen3MoeConfig(
            **attn, head_dim=16, num_hidden_layers=2, intermediate_size=80,
            moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, mlp_only_layers=[0]),
        "qwen3_moe_top8": lambda: T.Qwen3MoeConfig(
            **attn, head_dim=16, num_hidden_layers=2, intermediate_size=80,
            moe_intermediate_size=24, num_experts=16, num_experts_per_tok=8,
            norm_topk_prob=True),
        "qwen2_moe": lambda: T.Qwen2MoeConfig(
            **attn, num_hidden_layers=2, intermediate_size=80, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2),
        "mixtral": lambda: T.MixtralConfig(
            **attn, num_hidden_layers=2, intermediate_size=48, num_local_experts=4,
            num_experts_per_tok=2),
    }


MOE_ARCHS = list(moe_configs())


def save_moe(name: str, folder: str):
    """The HF model of config ``name``, randomized and saved to ``folder``."""
    cfg = moe_configs()[name]()
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    _randomize(hf, seed=len(name))
    hf.eval()
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            folder = str(tmp_path_factory.mktemp(name))
            hf = save_moe(name, folder)
            model, params = models.load_model(folder, dtype="float32")
            model.jit_forward = jax.jit(model.forward, donate_argnums=1, static_argnums=4)
            model.jit_logits = jax.jit(model.compute_logits)
            cache[name] = (hf, folder, model, params)
        return cache[name]

    return get


def _prompt(seed, n):
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


@pytest.mark.parametrize("name", MOE_ARCHS)
def test_chunked_prefill_then_decode(tiny_moe, name):
    """One 13-token prefill; then two prefill chunks (5, 6) and 5 decodes, NaN pool."""
    hf, _, model, params = tiny_moe(name)
    ids = _prompt(1, 13)
    assert_close(PagedRunner(model, params).step([("a", ids)])["a"], hf_logits(hf, ids),
                 f"{name} full")
    ids = _prompt(2, 16)
    runner = PagedRunner(model, params, seed=3)
    got = [runner.step([("s", ids[:5])])["s"], runner.step([("s", ids[5:11])])["s"]]
    for i in range(11, 16):
        got.append(runner.step([("s", ids[i:i + 1])])["s"])
    assert_close(np.concatenate(got), hf_logits(hf, ids), f"{name} chunked")


def test_ragged_dot_impl(tiny_moe):
    """The steps above ran ``gather`` (decodes of top-2) and ``blocked`` (prefills, and
    the top-8 decodes); ``ragged`` (what TPUs run) here."""
    hf, _, model, params = tiny_moe("qwen3_moe_top8")
    ids = _prompt(3, 11)
    meta = build_metadata([SeqChunk([5, 2, 9], 0, len(ids))], 4)
    caches = jax.tree_util.tree_map(lambda a: jnp.full_like(a, jnp.nan),
                                    model.allocate_kv_caches(12, 4))
    plan = ExecutionPlan(moe_impl="ragged")
    hidden, _ = model.jit_forward(params, caches, jnp.asarray(ids, jnp.int32), meta, plan)
    assert_close(model.compute_logits(params, hidden), hf_logits(hf, ids), "moe ragged")


def test_layout_and_registry(tiny_moe):
    _, _, model, params = tiny_moe("qwen3_moe_top2")
    mlp1, mlp0 = params["layers"][0]["mlp"], params["layers"][1]["mlp"]
    assert mlp0["experts_gate_up"].shape == (8, 64, 2, 32)  # [E, H, 2, I]
    assert mlp0["experts_down"].shape == (8, 32, 64)
    assert mlp0["gate"]["kernel"].shape == (64, 8)
    assert "gate_up" in mlp1 and "experts_down" not in mlp1  # mlp_only_layers=[0]: dense
    for arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"):
        assert models.model_class(arch).architecture == arch


# ----------------------------------------------------------------------------- grouped matmul


def _groups(rng, m, g):
    sizes = np.bincount(rng.integers(0, g, m), minlength=g)
    sizes[rng.integers(0, g)] = 0  # an empty group
    sizes[0] += m - sizes.sum()
    return sizes.astype(np.int32)


@pytest.mark.parametrize("impl", ["gather", "blocked", "ragged"])
@pytest.mark.parametrize("m,g", [(1, 4), (7, 8), (40, 5), (64, 16)])
def test_grouped_matmul_matches_reference(impl, m, g):
    rng = np.random.default_rng(m * 100 + g)
    x = rng.standard_normal((m, 24)).astype(np.float32)
    w = rng.standard_normal((g, 24, 10)).astype(np.float32)
    sizes = _groups(rng, m, g)
    used = m - 1 if m > 1 else m  # then the last row belongs to no group: its output is 0
    sizes[np.nonzero(sizes)[0][-1]] -= m - used
    gid = np.repeat(np.arange(g), sizes)
    ref = np.zeros((m, 10), np.float32)
    ref[:used] = np.einsum("mk,mkn->mn", x[:used], w[gid])
    got = np.asarray(jax.jit(grouped_matmul, static_argnums=3)(x, w, jnp.asarray(sizes), impl))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    dense = np.asarray(dense_all_experts(x, w, jnp.asarray(sizes)))
    np.testing.assert_allclose(dense, ref, rtol=1e-5, atol=1e-5)


def _dot_flops(jaxpr, mult: int = 1) -> int:
    """Multiply-adds of every dot_general in ``jaxpr``, loop bodies counted per trip."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            k = int(np.prod([eqn.invars[0].aval.shape[d] for d in lc]))
            total += mult * int(np.prod(eqn.outvars[0].aval.shape)) * k
        trips = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for v in eqn.params.values():
            sub = v.jaxpr if isinstance(v, ClosedJaxpr) else v
            if isinstance(sub, Jaxpr):
                total += _dot_flops(sub, mult * trips)
    return total


@pytest.mark.parametrize("m", [8, 512])
def test_no_path_computes_every_expert(m):
    """With 16 experts, the programs multiply at most the rows' own work (M x K x N) plus
    padding blocks, never the dense G x that: gather exactly the rows, blocked at most
    ceil(M / 16) + min(G, M) blocks of 16 rows (auto picks gather for few rows)."""
    g, k, n = 16, 64, 32
    args = (jnp.zeros((m, k)), jnp.zeros((g, k, n)), jnp.zeros((g,), jnp.int32))
    own = m * k * n
    assert _dot_flops(jax.make_jaxpr(dense_all_experts)(*args).jaxpr) >= g * own
    bound = {"gather": own, "blocked": (-(-m // 16) + min(g, m)) * 16 * k * n}
    for impl in ("gather", "blocked", "auto"):
        flops = _dot_flops(jax.make_jaxpr(lambda *a, i=impl: grouped_matmul(*a, i))(*args).jaxpr)
        assert own <= flops <= bound.get(impl, 2 * own), (impl, flops / own)


# ----------------------------------------------------------------------------- engine


def test_greedy_tokens_with_preemption(tiny_moe):
    """Three prompts on a pool too small for all of them: preemptions happen, and every
    sequence still gives transformers' greedy tokens."""
    from pagedjax import LLM, SamplingParams
    from tests.distributed.test_parallel import save_tiny_tokenizer

    hf, folder, _, _ = tiny_moe("mixtral")
    save_tiny_tokenizer(folder, VOCAB)
    prompts = [_prompt(10 + i, 9 + 3 * i) for i in range(3)]
    llm = LLM(folder, dtype="float32", page_size=4, num_pages=14, max_model_len=48,
              max_num_seqs=3, max_num_batched_tokens=16)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                              min_new_tokens=12)[0, len(p):].tolist()
        assert list(o.outputs[0].token_ids) == ref


def test_pallas_grouped_matmul_interpret():
    """The Pallas block kernel (interpret mode) gives the blocked implementation's result."""
    rng = np.random.default_rng(7)
    m, g = 37, 6
    x = jnp.asarray(rng.standard_normal((m, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((g, 16, 24)), jnp.float32)
    sizes = jnp.asarray(_groups(rng, m, g))
    ref = grouped_matmul(x, w, sizes, "blocked", block=8)
    got = grouped_matmul(x, w, sizes, "pallas", block=8)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)
