"""A padded step's padding rows are left out of the block kernel (kernels_pallas/live_rows.py).

* A fresh trace of a decode step of 3 rows (padded to 4) hands every block-kernel call
  (4 projections a layer and the tied head) the step's real-row count.
* Batches whose steps carry padding rows (3 prompts: buckets of 4, then 2 as they end)
  give bit for bit the greedy tokens and logprobs of the same engine computing every row.
"""

from __future__ import annotations

import jax
import pytest

from pagedjax import LLM, SamplingParams
from pagedjax.kernels_pallas import live_rows
from pagedjax.worker import program_store
from tests.utils.step_trace import trace_decode_step

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the C++ block kernel")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]


def test_padding_rows_are_left_out_and_change_nothing(smollm2_gguf, monkeypatch):
    # Each engine traces its own programs (the store would hand the second one the
    # first one's, compiled with the counts).
    monkeypatch.setattr(program_store, "set_root", lambda path: None)
    monkeypatch.setattr(program_store, "_root", None)
    kw = dict(quantization="gguf", max_model_len=256, max_num_seqs=4, num_pages=64)
    llm = LLM(smollm2_gguf, **kw)
    counts = []
    real = live_rows.lookup
    monkeypatch.setattr(live_rows, "lookup", lambda m: counts.append(real(m)) or counts[-1])
    trace_decode_step(llm.llm_engine.runner, rows=3)
    monkeypatch.setattr(live_rows, "lookup", real)
    layers = llm.llm_engine.info.num_layers
    assert len(counts) == 4 * layers + 1 and all(c is not None for c in counts), counts

    sps = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2)
           for n in (5, 9, 14)]
    left_out = [o.outputs[0] for o in llm.generate(PROMPTS, sps, use_tqdm=False)]
    del llm
    every_row = []
    monkeypatch.setattr(live_rows, "lookup", lambda m: every_row.append(m))  # None: all rows
    every = [o.outputs[0] for o in LLM(smollm2_gguf, **kw).generate(PROMPTS, sps,
                                                                    use_tqdm=False)]
    assert every_row  # the second engine traced its steps without the counts
    for a, b in zip(left_out, every):
        assert a.token_ids == b.token_ids
        assert a.cumulative_logprob == b.cumulative_logprob
