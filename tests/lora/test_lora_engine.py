"""Multi-LoRA serving through LLM: mixed batches, the LRU slot table, errors, prefix cache.

A tiny random Llama with the real default model's tokenizer (vocabulary 49152),
PEFT adapters with random non-zero weights (numerics against PEFT itself are in
tests/lora/test_lora.py).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from pagedjax import LLM, LoRARequest, SamplingParams  # noqa: E402
from pagedjax.core.request import RequestStatus  # noqa: E402
from pagedjax.worker.plan import CompileCounter  # noqa: E402
from tests.utils.lora import make_adapter, tiny_hf_model  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
KW = dict(max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64, num_pages=64,
          page_size=16, enable_lora=True, max_loras=3, max_lora_rank=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(base folder, {id: adapter folder}) — four adapters of ranks 2..8."""
    root = tmp_path_factory.mktemp("lora_engine")
    base = tiny_hf_model("llama", vocab=49152, seed=5)
    base.save_pretrained(root / "base")
    adapters = {}
    for i, r in zip(range(1, 5), (2, 4, 8, 4)):
        make_adapter(base, str(root / f"a{i}"), seed=100 + i, r=r, alpha=2 * r)
        adapters[i] = str(root / f"a{i}")
    return str(root / "base"), adapters


@pytest.fixture(scope="module")
def llm(tiny, smollm2_gguf):
    return LLM(tiny[0], tokenizer=smollm2_gguf, **KW)


def _lora(adapters, i):
    return None if i == 0 else LoRARequest(f"a{i}", i, adapters[i])


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 49152, int(rng.integers(5, 40)))] for _ in range(n)]


def test_mixed_batch_equals_each_alone(llm, tiny):
    _, adapters = tiny
    which = [0, 1, 2, 3, 1, 0, 3, 2]  # base + three adapters, interleaved
    prompts = _prompts(len(which))
    loras = [_lora(adapters, i) for i in which]
    mixed = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    alone = [llm.generate([p], GREEDY, use_tqdm=False, lora_request=lr)[0]
             for p, lr in zip(prompts, loras)]
    for i, (m, a) in enumerate(zip(mixed, alone)):
        assert m.outputs[0].token_ids == a.outputs[0].token_ids, f"row {i} (adapter {which[i]})"
    # The adapters matter: the same prompt gives different tokens per adapter.
    outs = [llm.generate([prompts[0]], GREEDY, use_tqdm=False, lora_request=_lora(adapters, i))[0]
            for i in range(4)]
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 4
    assert llm.llm_engine.pool_stats().used == 0


def test_lru_eviction_and_no_recompiles(llm, tiny):
    _, adapters = tiny
    eng = llm.llm_engine
    eng.runner.warmup(progress=False)
    mgr = eng.lora
    before = CompileCounter.count
    p = _prompts(1, seed=3)[0]
    for i in (1, 2, 3):  # fill the three slots; 1 is now the least recently used
        llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, i))
    assert set(mgr.resident()) == {1, 2, 3}
    llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 2))  # touch 2
    evictions = mgr.num_evictions
    llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 4))
    assert set(mgr.resident()) == {2, 3, 4}, "the least recently used adapter (1) goes"
    assert mgr.num_evictions == evictions + 1
    # 1 comes back (evicting 3, the LRU now) and gives the same tokens as before.
    first = llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 1))
    assert set(mgr.resident()) == {1, 2, 4}
    again = llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 1))
    assert first[0].outputs[0].token_ids == again[0].outputs[0].token_ids
    assert CompileCounter.count - before == 0, "adapter swaps must not recompile"
    assert eng.pool_stats().used == 0


def test_held_slots_make_requests_wait(llm, tiny):
    """Four adapters, three slots, all requests at once: the fourth waits (never an
    error), a running request's adapter is never evicted, every row is right."""
    _, adapters = tiny
    eng = llm.llm_engine
    prompts = _prompts(4, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = [llm.generate([p], params, use_tqdm=False, lora_request=_lora(adapters, i + 1))[0]
             for i, p in enumerate(prompts)]
    ids = []
    for i, p in enumerate(prompts):
        eng.add_request(f"w{i}", p, params, lora_request=_lora(adapters, i + 1))
        ids.append(f"w{i}")
    done, waited = {}, False
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
        running = {r.lora_int_id for r in eng.scheduler.running}
        assert running <= set(eng.lora.resident()), "a running adapter left its slot"
        assert len(running) <= 3
        req = eng.scheduler.get_request("w3")
        waited |= req is not None and req.status == RequestStatus.WAITING and len(running) == 3
    assert waited, "the fourth adapter's request should have waited for a slot"
    for i, rid in enumerate(ids):
        assert done[rid].outputs[0].token_ids == alone[i].outputs[0].token_ids
    assert eng.pool_stats().used == 0


def test_prefix_cache_keyed_by_adapter(tiny, smollm2_gguf):
    base, adapters = tiny
    llm = LLM(base, tokenizer=smollm2_gguf, enable_prefix_caching=True, **KW)
    p = _prompts(1, seed=9)[0] * 3  # > 2 full pages
    a1 = llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 1))[0]
    a2 = llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 2))[0]
    b = llm.generate([p], GREEDY, use_tqdm=False)[0]
    assert a2.num_cached_tokens == 0 and b.num_cached_tokens == 0, "no sharing across adapters"
    a1_again = llm.generate([p], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 1))[0]
    assert a1_again.num_cached_tokens >= 32, "the same adapter reuses its pages"
    assert a1_again.outputs[0].token_ids == a1.outputs[0].token_ids
    assert len({tuple(o.outputs[0].token_ids) for o in (a1, a2, b)}) == 3
    assert llm.llm_engine.pool_stats().used == 0


def _adapter_variant(src, dst, **config_changes):
    import shutil

    shutil.copytree(src, dst)
    path = os.path.join(dst, "adapter_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(config_changes)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return str(dst)


def test_bad_adapters_are_clear_errors(llm, tiny, tmp_path):
    base, adapters = tiny
    p = [5, 6, 7]

    def err(lora):
        with pytest.raises(ValueError) as e:
            llm.generate([p], GREEDY, use_tqdm=False, lora_request=lora)
        return str(e.value)

    assert "not a folder" in err(LoRARequest("x", 50, str(tmp_path / "nope")))
    os.makedirs(tmp_path / "empty")
    assert "adapter_config.json is missing" in err(LoRARequest("x", 51, str(tmp_path / "empty")))
    # rank 16 > max_lora_rank 8
    big = tiny_hf_model("llama", vocab=49152, seed=5)
    make_adapter(big, str(tmp_path / "r16"), seed=1, r=16, alpha=16)
    assert "max_lora_rank=8" in err(LoRARequest("x", 52, str(tmp_path / "r16")))
    # an embedding target
    make_adapter(big, str(tmp_path / "emb"), seed=1, r=2, targets=["embed_tokens", "q_proj"])
    assert "not supported" in err(LoRARequest("x", 53, str(tmp_path / "emb")))
    # another base model (hidden size 32)
    import transformers as T

    other = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=49152, hidden_size=32,
                                             intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2))
    make_adapter(other, str(tmp_path / "other"), seed=1, r=2)
    assert "another base model" in err(LoRARequest("x", 54, str(tmp_path / "other")))
    dora = _adapter_variant(adapters[1], tmp_path / "dora", use_dora=True)
    assert "DoRA" in err(LoRARequest("x", 55, dora))
    # one id, two paths
    assert "own id" in err(LoRARequest("y", 1, adapters[2]))
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("z", 0, adapters[1])
    assert llm.llm_engine.pool_stats().used == 0
    assert not llm.llm_engine.has_unfinished_requests()


def test_lora_needs_enable_lora(tiny, smollm2_gguf):
    base, adapters = tiny
    kw = {k: v for k, v in KW.items() if k not in ("enable_lora", "max_loras", "max_lora_rank")}
    llm = LLM(base, tokenizer=smollm2_gguf, **kw)
    assert llm.llm_engine.runner.params["layers"][0]["attn"]["qkv_proj"].get("lora") is None
    with pytest.raises(ValueError, match="enable_lora"):
        llm.generate([[5, 6]], GREEDY, use_tqdm=False, lora_request=_lora(adapters, 1))


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_speculative_decoding_with_adapters(llm, tiny, smollm2_gguf, kind):
    """A mixed batch of three adapters and the base model with speculation gives the
    same greedy tokens as without; the target verifies with each row's adapter (the
    draft, here the base model itself, proposes without adapters)."""
    base, adapters = tiny
    which = [0, 1, 2, 3, 2]
    prompts = [p * 2 for p in _prompts(len(which), seed=13)]  # repeats for n-gram lookup
    loras = [_lora(adapters, i) for i in which]
    chat_lora = _lora(adapters, 1)
    want = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    spec = ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
            if kind == "ngram" else {"model": base, "num_speculative_tokens": 3})
    sllm = LLM(base, tokenizer=smollm2_gguf, speculative_config=spec, **KW)
    got = sllm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids, f"row {i} (adapter {which[i]})"
    stats = sllm.llm_engine.spec_decode_stats()
    assert stats["num_draft_tokens"] > 0
    if kind == "draft":  # base-model proposals: the base row accepts all, adapters not
        assert got[0].metrics.acceptance_rate == 1.0
        assert min(o.metrics.acceptance_rate for o in got[1:]) < 1.0
    msgs = [{"role": "user", "content": "Hi"}]

    def chat(engine, lora):
        return engine.chat(msgs, GREEDY, use_tqdm=False, lora_request=lora)[0].outputs[0].token_ids

    assert chat(sllm, chat_lora) == chat(llm, chat_lora) != chat(llm, None)
    assert sllm.llm_engine.pool_stats().used == 0
