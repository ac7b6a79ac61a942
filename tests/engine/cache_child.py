"""One engine start in a fresh process, for tests/engine/test_compile_cache.py:
build the engine, compile every program (warm-up), generate, and print on the
last line a JSON object with the programs compiled and read back from the
persistent cache, and the tokens and logprobs generated.

    python -m tests.engine.cache_child MODEL TOKENIZER CACHE_DIR MAX_NUM_SEQS
"""

from __future__ import annotations

import json
import sys


def main(model: str, tokenizer: str, cache: str, max_num_seqs: int) -> dict:
    from pagedjax import LLM, SamplingParams
    from pagedjax.worker import program_store
    from pagedjax.worker.plan import CompileCounter

    CompileCounter.install()
    llm = LLM(model, tokenizer=tokenizer, compilation_cache_dir=cache, max_model_len=64,
              max_num_seqs=max_num_seqs, max_num_batched_tokens=32, num_pages=24,
              page_size=16)
    loaded = CompileCounter.compiled(), CompileCounter.cache_hits
    llm.llm_engine.runner.warmup(progress=False, workers=1)
    warmed = CompileCounter.compiled(), CompileCounter.cache_hits
    prompts = [[5, 17, 300, 41], [9] * 20, [7, 8]]
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, top_p=0.95, seed=3, max_tokens=6,
                             ignore_eos=True, logprobs=2)]
    outs = llm.generate(prompts * 2, params * 3, use_tqdm=False)
    return {"load": {"compiled": loaded[0], "read_back": loaded[1]},
            "warmup": {"compiled": warmed[0] - loaded[0], "read_back": warmed[1] - loaded[1]},
            "generate": {"compiled": CompileCounter.compiled() - warmed[0],
                         "read_back": CompileCounter.cache_hits - warmed[1]},
            "store": dict(program_store.counts),
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "logprobs": [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs,
                                                         o.outputs[0].token_ids)]
                         for o in outs]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
