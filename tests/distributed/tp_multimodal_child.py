"""Child process of tests/distributed/test_tp_multimodal.py (run with forced CPU devices):
generates from a tiny LLaVA or Qwen2.5-VL folder under tensor parallelism and prints the
tokens as JSON."""

import json
import sys


def llava_prompts():
    from tests.utils import vlm

    imgs = [vlm.random_image(60), vlm.random_image(61)]
    return [{"prompt_token_ids": [1, 5, vlm.IMAGE_TOKEN, 7],
             "multi_modal_data": {"image": imgs[0]}},
            {"prompt_token_ids": [1, vlm.IMAGE_TOKEN, 6, vlm.IMAGE_TOKEN],
             "multi_modal_data": {"image": imgs}},
            {"prompt_token_ids": [1, 20, 21, 22]}]


def qwen_prompts():
    from tests.utils import qwen_vl as Q
    from tests.utils import vlm

    imgs = [vlm.random_image(62, (40, 32)), vlm.random_image(63, (23, 19))]
    one = [Q.VISION_START, Q.IMAGE_TOKEN, Q.VISION_END]
    return [{"prompt_token_ids": [1, 5] + one + [7], "multi_modal_data": {"image": imgs[0]}},
            {"prompt_token_ids": [1] + one + [6] + one, "multi_modal_data": {"image": imgs}},
            {"prompt_token_ids": [1, 20, 21, 22]}]


if __name__ == "__main__":
    from pagedjax import LLM, SamplingParams

    folder, tp = sys.argv[1], int(sys.argv[2])
    kind = sys.argv[3] if len(sys.argv) > 3 else "llava"
    llm = LLM(folder, tensor_parallel_size=tp, num_pages=64, page_size=4, max_model_len=128,
              max_num_batched_tokens=16)
    prompts = qwen_prompts() if kind == "qwen" else llava_prompts()
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                        use_tqdm=False)
    print(json.dumps([o.outputs[0].token_ids for o in outs]))
