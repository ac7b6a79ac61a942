"""The engine end to end on the real default model, checked against transformers.

One transformers model (PyTorch, loaded from the same GGUF file) gives the
reference greedy continuations; pagedjax must produce the same tokens under
preemption, chunked prefill, prefix caching, parallel sampling and beam search.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from pagedjax import LLM, BeamSearchParams, SamplingParams

MAX_TOKENS = 20

PROMPTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "The three primary colors are",
    "Water boils at",
    "import numpy as np\nx = np.",
    "Translate to French: Good morning ->",
    "The best way to learn a language is",
    "In 1492, Columbus",
    "List three fruits:",
    "Q: What is 2 + 2?\nA:",
    "The quick brown fox",
    # Long prompts: split across several chunks by a small token budget.
    "Summarize the following text. " + "The cat sat on the mat and looked at the bird. " * 12,
    "Explain this code: " + "for i in range(10):\n    print(i * i)\n" * 8,
]


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path, name = os.path.split(smollm2_gguf)
    model = AutoModelForCausalLM.from_pretrained(path, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="module")
def llm_small_pool():
    # 24 pages of 16 tokens for 17 requests: forces preemption; a 32-token budget
    # forces chunked prefill of the long prompts.
    return LLM(max_model_len=512, num_pages=24, max_num_seqs=16, max_num_batched_tokens=32,
               page_size=16)


@pytest.fixture(scope="module")
def hf_greedy(hf_model, llm_small_pool):
    import torch

    tok = llm_small_pool.get_tokenizer()
    eos = llm_small_pool.llm_engine.eos_token_ids
    out = {}
    for p in PROMPTS:
        ids = tok.encode(p)
        with torch.no_grad():
            gen = hf_model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                    eos_token_id=list(eos), pad_token_id=eos[0])
        out[p] = gen[0, len(ids):].tolist()
    return out


def test_greedy_matches_transformers_with_preemption_and_chunking(llm_small_pool, hf_greedy):
    llm = llm_small_pool
    engine = llm.llm_engine
    sched = engine.scheduler
    preemptions = []
    chunked = []
    orig_schedule = sched.schedule

    def spy():
        out = orig_schedule()
        preemptions.extend(out.preempted_ids)
        chunked.extend(r.request_id for r in out.rows if r.num_samples == 0)
        return out

    sched.schedule = spy
    try:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                            use_tqdm=False)
    finally:
        sched.schedule = orig_schedule
    assert preemptions, "the pool was meant to be too small: no preemption happened"
    assert chunked, "no prompt was split into chunks"
    for p, o in zip(PROMPTS, outs):
        assert o.outputs[0].token_ids == hf_greedy[p], p
    stats = engine.pool_stats()
    assert stats.used == 0, "finished requests must free every page"


def test_prompt_logprobs_survive_preemption(llm_small_pool):
    """Requests with prompt logprobs that are preempted (and recomputed) report each
    prompt position once, with the values they get when run alone."""
    llm = llm_small_pool
    sched = llm.llm_engine.scheduler
    preempted = []
    orig_schedule = sched.schedule

    def spy():
        out = orig_schedule()
        preempted.extend(out.preempted_ids)
        return out

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, prompt_logprobs=1)
    sched.schedule = spy
    try:
        crowded = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        sched.schedule = orig_schedule
    assert preempted, "the pool was meant to be too small: no preemption happened"
    for p, o in zip(PROMPTS, crowded):
        alone = llm.generate([p], params, use_tqdm=False)[0]
        assert len(o.prompt_logprobs) == len(o.prompt_token_ids) and o.prompt_logprobs[0] is None
        for pos, (got, want) in enumerate(zip(o.prompt_logprobs[1:], alone.prompt_logprobs[1:])):
            tok = o.prompt_token_ids[pos + 1]
            assert got[tok].rank == want[tok].rank, (p, pos)
            assert abs(got[tok].logprob - want[tok].logprob) < 1e-3, (p, pos)
        assert o.outputs[0].token_ids == alone.outputs[0].token_ids, p


def test_prefix_caching_shared_system_prompt(hf_greedy, hf_model):
    import torch

    llm = LLM(max_model_len=512, num_pages=200, max_num_seqs=8, max_num_batched_tokens=64,
              enable_prefix_caching=True)
    system = ("You are a helpful assistant. Answer briefly and precisely, and never make up "
              "facts. If you do not know, say so. ")
    questions = ["What is the capital of Italy?", "Name a large mammal.", "What color is the sky?",
                 "How many legs does a spider have?"]
    prompts = [system + q for q in questions]
    first = llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    rest = llm.generate(prompts[1:], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    stats = llm.llm_engine.pool_stats()
    assert stats.prefix_hits > 0, "the shared system prompt should hit the prefix cache"
    assert all(o.num_cached_tokens >= 16 for o in rest)
    tok = llm.get_tokenizer()
    eos = list(llm.llm_engine.eos_token_ids)
    for p, o in zip(prompts, first + rest):
        ids = tok.encode(p)
        with torch.no_grad():
            gen = hf_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                    eos_token_id=eos, pad_token_id=eos[0])
        assert o.outputs[0].token_ids == gen[0, len(ids):].tolist(), p


def test_seeded_sampling_independent_of_batch(llm_small_pool):
    llm = llm_small_pool
    sp = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=12, seed=1234)
    alone = llm.generate(["The weather today is"], sp, use_tqdm=False)[0].outputs[0].text
    crowd_prompts = PROMPTS[:7] + ["The weather today is"] + PROMPTS[7:12]
    crowd_params = [SamplingParams(temperature=1.0, max_tokens=12) for _ in crowd_prompts]
    crowd_params[7] = sp
    crowded = llm.generate(crowd_prompts, crowd_params, use_tqdm=False)[7].outputs[0].text
    assert alone == crowded


def test_parallel_sampling_shares_pages(llm_small_pool):
    llm = llm_small_pool
    engine = llm.llm_engine
    prompt = "Write a short poem about the sea. " * 4  # several full pages to share
    peak = {}

    def run(params_list, prompts):
        peak["used"] = 0
        sched = engine.scheduler
        orig = sched.schedule

        def spy():
            out = orig()
            peak["used"] = max(peak["used"], sched.stats().used)
            return out

        sched.schedule = spy
        try:
            return llm.generate(prompts, params_list, use_tqdm=False)
        finally:
            sched.schedule = orig

    out = run(SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=7), [prompt])
    assert len(out[0].outputs) == 4
    shared_peak = peak["used"]
    # Independent requests with their own cache salts share nothing (automatic prefix
    # caching, on by default, would otherwise share the prompt's full pages too).
    salted = [{"prompt": prompt, "cache_salt": f"s{i}"} for i in range(4)]
    run(SamplingParams(temperature=1.0, max_tokens=8), salted)
    independent_peak = peak["used"]
    assert shared_peak < independent_peak, (shared_peak, independent_peak)
    assert engine.pool_stats().used == 0


def test_cache_salt_keeps_prefix_cache_apart(llm_small_pool):
    """vLLM's cache_salt: the same prompt hits the prefix cache only under the same salt."""
    engine = llm_small_pool.llm_engine
    prompt = "Tell me about the history of the lighthouse. " * 4
    params = SamplingParams(temperature=0.0, max_tokens=2)

    def hits(p):
        before = engine.pool_stats().prefix_hits
        out = llm_small_pool.generate([p], params, use_tqdm=False)[0]
        return engine.pool_stats().prefix_hits - before, out.outputs[0].token_ids

    first, toks = hits({"prompt": prompt, "cache_salt": "alice"})
    assert first == 0
    again, toks_again = hits({"prompt": prompt, "cache_salt": "alice"})
    assert again > 0 and toks_again == toks  # a hit, and the same greedy tokens
    other, toks_other = hits({"prompt": prompt, "cache_salt": "bob"})
    assert other == 0 and toks_other == toks
    with pytest.raises(ValueError, match="cache_salt must be a string"):
        llm_small_pool.generate([{"prompt": prompt, "cache_salt": 3}], params, use_tqdm=False)


def _reference_beam_search(hf_model, tok, eos, prompt, beam_width, max_tokens):
    """Straightforward beam search on transformers' model: full recompute of every beam."""
    import torch

    ids = tok.encode(prompt)
    beams = [([], 0.0)]
    done = []
    for _ in range(max_tokens):
        cands = []
        for toks, cum in beams:
            with torch.no_grad():
                logits = hf_model(torch.tensor([ids + toks])).logits[0, -1]
            lp = torch.log_softmax(logits.double(), -1).numpy()
            top = np.argsort(-lp)[:2 * beam_width]
            cands += [(cum + float(lp[t]), toks + [int(t)]) for t in top]
        cands.sort(key=lambda c: -c[0])
        beams = []
        for cum, toks in cands:
            if len(beams) >= beam_width:
                break
            if toks[-1] in eos:
                done.append((toks, cum))
            else:
                beams.append((toks, cum))
        if not beams:
            break
    done += beams
    done.sort(key=lambda b: -(b[1] / len(b[0])))
    return [b[0] for b in done[:beam_width]]


def test_beam_search_matches_reference(llm_small_pool, hf_model):
    llm = llm_small_pool
    prompt = ("Paris is the capital and largest city of France. It is known for the Eiffel "
              "Tower, the Louvre museum and its cafes. The capital of France is")
    engine = llm.llm_engine
    peak = {"used": 0}
    orig = engine.scheduler.schedule

    def spy():
        out = orig()
        peak["used"] = max(peak["used"], engine.scheduler.stats().used)
        return out

    engine.scheduler.schedule = spy
    try:
        out = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=6))
    finally:
        engine.scheduler.schedule = orig
    ids = llm.get_tokenizer().encode(prompt)
    ours = [s.tokens[len(ids):] for s in out[0].sequences]
    ref = _reference_beam_search(hf_model, llm.get_tokenizer(), set(engine.eos_token_ids),
                                 prompt, 3, 6)
    # Forked beams share the prompt's pages: fewer than 3 independent copies.
    pages_one = -(-(len(ids) + 6) // 16)
    assert pages_one >= 3
    assert peak["used"] < 3 * pages_one, (peak, pages_one)
    assert ours[0] == ref[0]
    assert sorted(map(tuple, ours)) == sorted(map(tuple, ref))
    assert llm.llm_engine.pool_stats().used == 0


def test_bad_input_raises_clear_errors(llm_small_pool):
    llm = llm_small_pool
    with pytest.raises(ValueError, match="empty"):
        llm.generate([""], SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["word " * 600], SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="max_num_seqs"):
        llm.generate(["hi"], SamplingParams(n=64, max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match="num_pages|pool"):
        LLM(max_model_len=512, num_pages=1)
    # The engine still serves after the errors, with no page leaked.
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=3),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert llm.llm_engine.pool_stats().used == 0


def test_logprobs_and_stop_strings(llm_small_pool):
    llm = llm_small_pool
    sp = SamplingParams(temperature=0.0, max_tokens=16, logprobs=3, prompt_logprobs=2)
    o = llm.generate(["The capital of France is"], sp, use_tqdm=False)[0]
    c = o.outputs[0]
    assert len(c.logprobs) == len(c.token_ids)
    for tok, lp in zip(c.token_ids, c.logprobs):
        assert tok in lp and lp[tok].rank == 1  # greedy picks the rank-1 token
        assert 3 <= len(lp) <= 4
    assert o.prompt_logprobs[0] is None and len(o.prompt_logprobs) == len(o.prompt_token_ids)
    assert np.isclose(c.cumulative_logprob, sum(lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)),
                      atol=1e-3)
    full = c.text
    stop_at = full.strip().split(" ")[1]
    o2 = llm.generate(["The capital of France is"],
                      SamplingParams(temperature=0.0, max_tokens=16, stop=[stop_at]), use_tqdm=False)[0]
    assert o2.outputs[0].finish_reason == "stop" and o2.outputs[0].stop_reason == stop_at
    assert stop_at not in o2.outputs[0].text and full.startswith(o2.outputs[0].text)


def test_startup_heap_frozen_once(llm_small_pool):
    """After start-up the engine's heap is out of the cyclic collector's sight (full
    collections would scan it every few steps), and a later engine does not freeze
    again over it (nor over a freeze the application made)."""
    import gc

    from pagedjax.engine.startup import freeze_startup_heap

    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # modules, the model and the tokenizer of the fixture's engine
    freeze_startup_heap()
    assert gc.get_freeze_count() == frozen
    # The engine still collects what it drops: a cycle made after start-up is freed.
    class Cycle:
        pass

    a = Cycle()
    a.self = a
    import weakref

    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None


def test_engine_step_delta_outputs(llm_small_pool):
    """output_kind=DELTA at the engine: each output carries only what is new, and the
    deltas (text, token ids, logprobs; prompt logprobs once) add up to the final output
    LLM.generate gives, also with n=2 seeded samples and a stop string."""
    from pagedjax import RequestOutputKind

    llm = llm_small_pool
    engine = llm.llm_engine
    prompt = "The capital of France is"
    ref = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16, logprobs=2,
                                                prompt_logprobs=1), use_tqdm=False)[0]
    stop_at = ref.outputs[0].text.strip().split(" ")[2]
    cases = {
        "greedy": SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, prompt_logprobs=1),
        "n2": SamplingParams(temperature=0.8, top_p=0.95, n=2, seed=7, max_tokens=12),
        "stop": SamplingParams(temperature=0.0, max_tokens=16, stop=[stop_at]),
    }
    finals = {name: llm.generate([prompt], p, use_tqdm=False)[0] for name, p in cases.items()}
    for name, p in cases.items():
        q = p.clone()
        q.output_kind = RequestOutputKind.DELTA
        engine.add_request(f"delta-{name}", prompt, q)
    seen = {name: [] for name in cases}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id[len("delta-"):]].append(out)
    for name, outs in seen.items():
        final = finals[name]
        assert len(outs) > 2 and outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert sum(o.prompt_logprobs is not None for o in outs) == (
            1 if cases[name].prompt_logprobs is not None else 0)
        for want in final.outputs:
            parts = [c for o in outs for c in o.outputs if c.index == want.index]
            assert "".join(c.text for c in parts) == want.text, name
            assert [t for c in parts for t in c.token_ids] == want.token_ids, name
            assert parts[-1].finish_reason == want.finish_reason, name
            assert sum(c.finish_reason is not None for c in parts) == 1, name
            if want.logprobs is not None:
                lps = [d for c in parts for d in c.logprobs]
                assert [sorted(d) for d in lps] == [sorted(d) for d in want.logprobs]
    assert finals["stop"].outputs[0].finish_reason == "stop"
    assert engine.pool_stats().used == 0
