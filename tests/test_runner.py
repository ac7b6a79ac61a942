"""Static shapes: after warm-up a varied workload compiles nothing new.

Uses a tiny random Llama (built with transformers, saved as safetensors) so
that warming up every bucket takes seconds, with the real default model's
tokenizer.
"""

from __future__ import annotations

import random

import pytest

from pagedjax import LLM, SamplingParams
from pagedjax.runner import CompileCounter, Runner
from models.base import ExecutionPlan


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


def test_bucket_sizes_are_powers():
    class Info:
        vocab_size = 10

    class M:
        info = Info()

    kw = dict(page_size=16, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=2048)
    # Pallas kernels: page-table width bucketed too.
    r = Runner(M(), {}, (), plan=ExecutionPlan(attn_backend="pallas_gpu"), **kw)
    assert r.bucket_sizes(3, 3, 2, decode=True) == (4, 4, 4)
    assert r.bucket_sizes(1, 1, 2, decode=True) == (1, 1, 4)
    assert r.bucket_sizes(9, 9, 5, decode=True) == (16, 16, 8)
    t, s, p = r.bucket_sizes(5, 100, 20, decode=False)
    assert (t, s, p) == (256, 8, 32)
    # Page buckets never exceed what max_model_len needs.
    assert r.bucket_sizes(1, 1, 500, decode=True)[2] == 128
    # XLA attention loops only over the live context: always the full width.
    r = Runner(M(), {}, (), plan=ExecutionPlan(attn_backend="xla"), **kw)
    assert r.bucket_sizes(3, 3, 2, decode=True) == (4, 4, 128)
    assert r.bucket_sizes(5, 100, 20, decode=False) == (256, 8, 128)
    shapes = r.warmup_shapes()
    assert {p for *_, p, _ in shapes} == {128}
    assert sorted(s for s, t, p, d in shapes if d) == [1, 2, 4, 8, 16, 32, 64]


def test_no_compilation_after_warmup(tiny_llama_dir, smollm2_gguf):
    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, max_model_len=128, max_num_seqs=8,
              max_num_batched_tokens=64, num_pages=40, page_size=16)
    runner = llm.llm_engine.runner
    runner.warmup(progress=False)
    before = CompileCounter.count
    rng = random.Random(0)
    for batch in range(6):
        prompts, params = [], []
        for _ in range(rng.randint(1, 12)):
            n_tok = rng.choice([1, 2, 5, 15, 16, 17, 40, 90])
            prompts.append([rng.randrange(3, 49152) for _ in range(n_tok)])
            kind = rng.choice(["greedy", "random", "top_p", "top_k", "logprobs", "n2"])
            kw = dict(max_tokens=rng.randint(1, 30), ignore_eos=True)
            if kind == "greedy":
                kw.update(temperature=0.0)
            elif kind == "random":
                kw.update(temperature=1.0, seed=rng.randrange(1000))
            elif kind == "top_p":
                kw.update(temperature=0.8, top_p=0.95)
            elif kind == "top_k":
                kw.update(temperature=0.8, top_k=50)
            elif kind == "logprobs":
                kw.update(temperature=0.0, logprobs=rng.choice([0, 3, 5, 20]))
            else:
                kw.update(temperature=1.0, n=2)
            params.append(SamplingParams(**kw))
        outs = llm.generate(prompts, params, use_tqdm=False)
        for o, p in zip(outs, params):
            assert all(len(c.token_ids) == p.max_tokens for c in o.outputs)
    assert CompileCounter.count - before == 0, repr(runner.shapes_seen)
    assert llm.llm_engine.pool_stats().used == 0


def test_scanned_layers_match_unrolled(tiny_llama_dir, smollm2_gguf):
    """lax.scan over stacked layers gives the same tokens and logprobs as the unrolled loop."""
    prompts = [[5, 17, 300, 4000, 12], list(range(100, 160)), [7]]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    results = []
    for scan in (True, False):
        llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, max_model_len=128, max_num_seqs=4,
                  max_num_batched_tokens=32, num_pages=24, scan_layers=scan)
        assert isinstance(llm.llm_engine.params["layers"], dict) == scan
        results.append(llm.generate(prompts, sp, use_tqdm=False))
    for a, b in zip(*results):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert abs(a.outputs[0].cumulative_logprob - b.outputs[0].cumulative_logprob) < 1e-3
