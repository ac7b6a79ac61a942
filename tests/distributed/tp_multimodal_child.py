"""Child process of tests/distributed/test_tp_multimodal.py (run with forced CPU devices):
generates from a tiny LLaVA folder under tensor parallelism and prints the tokens as JSON."""

import json
import sys

if __name__ == "__main__":
    from pagedjax import LLM, SamplingParams
    from tests.utils import vlm

    folder, tp = sys.argv[1], int(sys.argv[2])
    llm = LLM(folder, tensor_parallel_size=tp, num_pages=48, page_size=4, max_model_len=96,
              max_num_batched_tokens=16)
    imgs = [vlm.random_image(60), vlm.random_image(61)]
    prompts = [{"prompt_token_ids": [1, 5, vlm.IMAGE_TOKEN, 7],
                "multi_modal_data": {"image": imgs[0]}},
               {"prompt_token_ids": [1, vlm.IMAGE_TOKEN, 6, vlm.IMAGE_TOKEN],
                "multi_modal_data": {"image": imgs}},
               {"prompt_token_ids": [1, 20, 21, 22]}]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                        use_tqdm=False)
    print(json.dumps([o.outputs[0].token_ids for o in outs]))
