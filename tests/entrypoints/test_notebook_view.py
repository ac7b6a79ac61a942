"""PoolView, the notebook helper: it redraws while an LLM's generate() and an
AsyncLLM's requests run (pages in use in some pictures, all free in the last),
its pictures agree with the pool, and its HTML escapes request ids."""

from __future__ import annotations

import asyncio
import re

import pytest

from pagedjax import LLM, AsyncLLM, SamplingParams
from pagedjax.entrypoints import pool_html
from pagedjax.entrypoints.notebook import PoolView

ENGINE = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, num_pages=16,
              page_size=8)
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0)


def prompts(n):
    return [{"prompt_token_ids": [(5 * i + j) % 300 + 3 for j in range(12)]} for i in range(n)]


def test_llm_view_redraws_during_generate(tiny_llama_dir, smollm2_gguf):
    llm = LLM(tiny_llama_dir, tokenizer=smollm2_gguf, **ENGINE)
    view = PoolView(llm, interval=0.01)
    step = llm.llm_engine.step
    with view.watch():
        outs = llm.generate(prompts(6), PARAMS, use_tqdm=False)
    assert llm.llm_engine.step == step  # unwrapped
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    busy = [c for c in view.seen if c["used"]]
    assert len(busy) >= 3 and max(c["running"] for c in busy) == 4
    assert any(c["waiting"] for c in busy)
    last = view.seen[-1]
    assert last["used"] == 0 and last["running"] == last["waiting"] == 0
    st = llm.llm_engine.pool_stats()
    assert (last["free"], last["cached"]) == (st.free, st.cached)
    html = view.html()
    assert len(re.findall(r'<rect [^>]*data-kind="[.c]"', html)) == st.total
    tok = [p["tokens_per_s"] for p in view.live.latest()[1]]
    assert max(tok) > 0


def test_async_view_follows_requests(tiny_llama_dir, smollm2_gguf):
    allm = AsyncLLM(tiny_llama_dir, tokenizer=smollm2_gguf, **ENGINE)

    async def main():
        view = PoolView(allm, interval=0.02).show()
        await asyncio.sleep(0)

        async def one(i, p):
            return [o async for o in allm.generate(p, PARAMS, f"nb-{i}")]
        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts(6))))
        await asyncio.sleep(0.2)
        view.close()
        return view
    try:
        view = asyncio.run(main())
    finally:
        allm.shutdown()
    assert view.frames >= 3
    assert any(c["used"] and c["running"] for c in view.seen)
    assert view.seen[-1]["used"] == 0 and view.seen[-1]["running"] == 0


def test_html_escapes_request_ids():
    snap = {"grid": "u.", "refs": {}, "page_size": 8, "requests": [
        {"id": "<script>x</script>", "state": "running", "output_tokens": 1, "max_tokens": 4,
         "pages": [1], "preemptions": 0}],
        "counts": dict(running=1, waiting=0, used=1, total=2, cached=0, shared=0,
                       preemptions=0, steps=1)}
    html = pool_html.render(snap, [])
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html


def test_rejects_other_objects():
    with pytest.raises(TypeError, match="LLM or an AsyncLLM"):
        PoolView(object())
