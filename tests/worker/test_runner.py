"""Static shapes: after warm-up a varied workload compiles nothing new.

Uses a tiny random Llama (built with transformers, saved as safetensors) so
that warming up every bucket takes seconds, with the real default model's
tokenizer.
"""

from __future__ import annotations

import random

import numpy as np

import pytest

from pagedjax import LLM, SamplingParams
from pagedjax.worker.plan import CompileCounter
from pagedjax.worker.runner import Runner
from pagedjax.models.base import ExecutionPlan


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
        assert (0 not in llm.llm_engine.params["layers"]) == scan  # stacked: one entry per param
        results.append(llm.generate(prompts, sp, use_tqdm=False))
    for a, b in zip(*results):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert abs(a.outputs[0].cumulative_logprob - b.outputs[0].cumulative_logprob) < 1e-3


def test_params_keep_their_structure(tiny_llama_dir, smollm2_gguf):
    """The step program takes the parameters' leaves: arrays of the same tree may replace
    them (what LoRA writes do), another tree is refused with a message."""
    import jax

    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, max_model_len=64, max_num_seqs=2,
              num_pages=16)
    runner = llm.llm_engine.runner
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    before = llm.generate([[5, 17, 300]], sp, use_tqdm=False)[0].outputs[0].token_ids
    runner.params = jax.tree_util.tree_map(lambda a: a * 0, runner.params)
    assert all(not np.asarray(a).any() for a in runner.param_args)
    assert llm.generate([[5, 17, 300]], sp, use_tqdm=False)[0].outputs[0].token_ids != before
    runner.params = jax.tree_util.tree_map(lambda a: a, llm.llm_engine.params)
    assert llm.generate([[5, 17, 300]], sp, use_tqdm=False)[0].outputs[0].token_ids == before
    with pytest.raises(ValueError, match="changed structure"):
        runner.params = {"other": runner.param_args[0]}


def _reference_prepare(rows, ps, t, s, p, token_src):
    """Row by row, the obvious way: what Runner.prepare's vectorized code must give."""
    token_ids, src, positions, slots = (np.zeros(t, np.int32), np.full(t, -1, np.int32),
                                        np.zeros(t, np.int32), np.zeros(t, np.int32))
    kv_lens, page_table, cu = np.zeros(s, np.int32), np.zeros((s, p), np.int32), \
        np.zeros(s + 1, np.int32)
    logits_index = np.zeros(s, np.int32)
    off = 0
    for i, r in enumerate(rows):
        n = len(r.token_ids)
        for k in range(n):
            pos = r.start_pos + k
            token_ids[off + k] = r.token_ids[k]
            positions[off + k] = pos
            slots[off + k] = r.page_ids[pos // ps] * ps + pos % ps
        if r.token_ids[-1] < 0:
            src[off + n - 1] = token_src[r.request_id]
        kv_lens[i] = r.start_pos + n
        page_table[i, :min(p, len(r.page_ids))] = r.page_ids[:p]
        off += n
        cu[i + 1] = off
        logits_index[i] = off - 1
    cu[len(rows) + 1:] = off
    return dict(token_ids=token_ids, token_src=src, positions=positions, slot_mapping=slots,
                kv_lens=kv_lens, page_table=page_table, cu_q_lens=cu, logits_index=logits_index)


@pytest.mark.parametrize("seed", range(4))
def test_prepare_matches_row_by_row_reference(seed):
    from pagedjax.core.scheduler import ScheduledRow

    class Info:
        vocab_size = 50

    class M:
        info = Info()

    rng = random.Random(seed)
    ps = 4
    r = Runner(M(), {}, (), plan=ExecutionPlan(attn_backend="xla"), page_size=ps,
               max_num_seqs=16, max_num_batched_tokens=64, max_model_len=64)
    decode = seed % 2 == 0
    rows, token_src = [], {}
    for i in range(rng.randint(1, 12)):
        n = 1 if decode else rng.randint(1, 6)
        start = rng.randint(0, 40)
        pages = [rng.randint(1, 99) for _ in range(-(-(start + n) // ps))]
        toks = [rng.randint(0, 49) for _ in range(n)]
        if decode and rng.random() < 0.6:
            toks[-1] = -1  # a placeholder
            token_src[f"r{i}"] = rng.randint(0, 15)
        rows.append(ScheduledRow(f"r{i}", toks, start, pages, 1))
    batch, *_, (t, s, p) = r.prepare(rows, [], {}, {}, token_src)
    ref = _reference_prepare(rows, ps, t, s, p, token_src)
    got = dict(token_ids=batch.token_ids, token_src=batch.token_src,
               logits_index=batch.logits_index, **{k: getattr(batch.meta, k) for k in (
                   "positions", "slot_mapping", "kv_lens", "page_table", "cu_q_lens")})
    for k, v in ref.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert int(batch.meta.num_seqs) == len(rows)


def test_pack_unpack_round_trip_inside_jit():
    import jax

    from pagedjax.worker.packing import pack, unpack

    tree = {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.float32(2.5),
            "c": [np.array([True, False]), np.zeros((0, 4), np.int32)],
            "d": np.array([7, 8], np.uint32)}
    bufs, spec = pack(tree)
    assert len(bufs) == 4  # one buffer per dtype
    out = jax.jit(lambda b: unpack(b, spec))(bufs)
    for k in ("a", "b", "d"):
        np.testing.assert_array_equal(np.asarray(out[k]), tree[k])
        assert np.asarray(out[k]).dtype == np.asarray(tree[k]).dtype
    np.testing.assert_array_equal(np.asarray(out["c"][0]), tree["c"][0])
    assert out["c"][1].shape == (0, 4)
    assert spec == pack(tree)[1] and hash(spec) == hash(pack(tree)[1])  # static, cacheable
