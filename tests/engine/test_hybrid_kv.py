"""Hybrid KV allocation end to end: a tiny random Gemma 3 (sliding and full layers)
served with one page table per KV group gives transformers' greedy tokens through
long decodes over a NaN-filled pool, prefix-cache hits, preemption, n > 1 forks and
speculative rollback, while each sliding group holds only its window's pages."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pagedjax import LLM, SamplingParams  # noqa: E402
from pagedjax.engine.pool_snapshot import pool_snapshot  # noqa: E402
from pagedjax.utils import cdiv  # noqa: E402

VOCAB, WINDOW, PAGE = 128, 8, 4
TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    from tests.distributed.test_parallel import save_tiny_tokenizer
    from tests.models.test_models import _randomize

    cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        sliding_window=WINDOW, layer_types=TYPES, query_pre_attn_scalar=16,
        attn_logit_softcapping=None, final_logit_softcapping=None,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    _randomize(hf, seed=7)
    hf.eval()
    folder = str(tmp_path_factory.mktemp("gemma3_hybrid"))
    hf.save_pretrained(folder)
    save_tiny_tokenizer(folder, VOCAB)
    return hf, folder


def hf_greedy(hf, prompt, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          min_new_tokens=n)
    return out[0, len(prompt):].tolist()


def prompt(seed, n):
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def make_llm(folder, **kw):
    args = dict(dtype="float32", page_size=PAGE, max_model_len=160, max_num_seqs=4,
                max_num_batched_tokens=32, num_pages=120)
    args.update(kw)
    return LLM(folder, **args)


def nan_pool(llm):
    """Fill every K/V page with NaN: a kernel reading a page it should not gives NaN."""
    runner = llm.llm_engine.runner
    runner.kv_caches = jax.tree.map(lambda a: jnp.full_like(a, jnp.nan), runner.kv_caches)


def greedy(max_tokens, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def test_long_decode_matches_transformers_and_holds_the_window(tiny_gemma):
    hf, folder = tiny_gemma
    llm = make_llm(folder)
    engine = llm.llm_engine
    sched = engine.scheduler
    assert sched.groups is not None and len(sched.groups.layout.groups) == 3
    nan_pool(llm)
    prompts = [prompt(1, 37), prompt(2, 21)]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, greedy(60))
    most = 0
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = list(o.outputs[0].token_ids)
        for r in sched.running:
            if r.num_computed_tokens > 40:  # well past the prompt chunks
                for g in (1, 2):
                    most = max(most, sched.groups.held(r, g))
        snap = pool_snapshot(engine)  # the dashboard attributes every group's pages
        assert sum(len(r["pages"]) for r in snap["requests"]) == snap["counts"]["used"]
    assert 0 < most <= cdiv(WINDOW, PAGE) + 1
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"] == hf_greedy(hf, p, 60)
    assert sched.stats().used == 0


def test_prefix_hits_forks_and_preemption(tiny_gemma):
    hf, folder = tiny_gemma
    llm = make_llm(folder, num_pages=40, max_num_seqs=3)
    nan_pool(llm)
    base = prompt(5, 30)
    first = llm.generate([{"prompt_token_ids": base + [9]}], greedy(8), use_tqdm=False)[0]
    assert list(first.outputs[0].token_ids) == hf_greedy(hf, base + [9], 8)
    prompts = [base + [11, 12], base + [13], prompt(6, 26)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [greedy(30), greedy(30, n=2), greedy(30)], use_tqdm=False)
    assert outs[0].num_cached_tokens == 28 and outs[1].num_cached_tokens == 28
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for p, o in zip(prompts, outs):
        want = hf_greedy(hf, p, 30)
        assert all(list(c.token_ids) == want for c in o.outputs)
    assert len(outs[1].outputs) == 2


def test_speculative_rollback(tiny_gemma):
    hf, folder = tiny_gemma
    llm = make_llm(folder, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                               "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    nan_pool(llm)
    p = prompt(8, 12) * 3  # repeats: the n-gram proposer has something to propose
    out = llm.generate([{"prompt_token_ids": p}], greedy(30), use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == hf_greedy(hf, p, 30)
    stats = llm.llm_engine.spec_decode_stats()
    assert stats and stats.get("num_draft_tokens", 0) > 0


def test_capacity_grows_and_is_logged(tiny_gemma, caplog):
    _, folder = tiny_gemma
    with caplog.at_level(logging.INFO, logger="pagedjax.engine.llm_engine"):
        hybrid = make_llm(folder, num_pages=None, cpu_kv_cache_gib=0.0005, max_num_seqs=16)
    uniform = make_llm(folder, num_pages=None, cpu_kv_cache_gib=0.0005, max_num_seqs=16,
                       disable_hybrid_kv_cache_manager=True)
    h, u = hybrid.llm_engine.kv_capacity, uniform.llm_engine.kv_capacity
    assert uniform.llm_engine.scheduler.groups is None
    # 6 layers in 2 arrays: 3x the page ids for the same bytes; a request needs its
    # full group's pages and each sliding group's window (and prompt chunk)
    assert abs(hybrid.llm_engine.num_pages - 3 * uniform.llm_engine.num_pages) < 3
    assert h["pages_per_request"] == 40 + 2 * (cdiv(WINDOW - 1 + 32, PAGE) + 1)
    assert u["pages_per_request"] == 40
    assert h["max_concurrency"] > 1.5 * u["max_concurrency"]
    assert "maximum concurrency for 160 tokens per request" in caplog.text


def test_warmup_covers_every_hybrid_step(tiny_gemma):
    """With one page table per KV group, warm-up builds the same [group, row, page]
    tables the steps use: after it, decodes past the window, prefix hits and forks
    compile nothing."""
    from pagedjax.worker.plan import CompileCounter

    hf, folder = tiny_gemma
    llm = make_llm(folder)
    llm.llm_engine.runner.warmup(progress=False, workers=1)
    c0 = CompileCounter.count
    base = prompt(8, 30)
    llm.generate([{"prompt_token_ids": base + [11]}], greedy(24), use_tqdm=False)
    prompts = [base + [12, 13], prompt(9, 45)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [greedy(24, n=2), greedy(24)], use_tqdm=False)
    assert CompileCounter.count - c0 == 0, repr(llm.llm_engine.runner.shapes_seen)
    assert outs[0].num_cached_tokens == 28 and len(outs[0].outputs) == 2
    assert list(outs[1].outputs[0].token_ids) == hf_greedy(hf, prompts[1], 24)
