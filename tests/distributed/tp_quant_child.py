"""Child process of tests/models/test_checkpoint_quant.py (run with 2 forced CPU devices):
greedy tokens and logprobs of a quantized checkpoint at TP=1 and TP=2, as JSON.

    python -m tests.distributed.tp_quant_child FOLDER TOKENIZER
"""

import json
import sys

if __name__ == "__main__":
    from pagedjax import LLM, SamplingParams

    folder, tokenizer = sys.argv[1], sys.argv[2]
    out = {}
    for tp in (1, 2):
        llm = LLM(folder, tokenizer=tokenizer, tensor_parallel_size=tp, num_pages=32,
                  page_size=4, max_model_len=64, max_num_batched_tokens=16,
                  attention_backend="auto" if tp == 1 else "xla")
        res = llm.generate([[1, 17, 300, 41, 99, 7], [5, 6, 7]],
                           SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                          logprobs=1), use_tqdm=False)
        out[tp] = {"kinds": sorted(set(llm.llm_engine.model.quantized.values())),
                   "tokens": [list(r.outputs[0].token_ids) for r in res],
                   "logprobs": [[lp[t].logprob for lp, t in zip(r.outputs[0].logprobs,
                                                                r.outputs[0].token_ids)]
                                for r in res]}
        del llm
    print(json.dumps(out))
