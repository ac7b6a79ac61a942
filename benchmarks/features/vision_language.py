"""Vision-language serving: encoder time per image, its share of a step, encoder-cache
hits, and a mixed text/image workload against text only.

    python benchmarks/features/vision_language.py
    python benchmarks/features/vision_language.py --requests 16 --max-tokens 16

The model is a random LLaVA with a SigLIP tower built here and saved to a temporary
folder (no weights are downloaded): a 224 x 224 image, 14 x 14 patches (256 image
tokens), a 6-layer 384-wide tower, and an 8-layer 512-wide Llama text model.
Reported:

* encoder ms per image (the encoder program alone, blocked until done), and the
  prefill step of a 272-token prompt with one image, so the encoder's share of the
  work an image brings = encoder / (encoder + that step);
* encoder-cache hits when ``--requests`` requests use 2 distinct images;
* throughput (prompt + output tokens per second) of ``--requests`` requests half of
  which carry an image, against the same requests with text tokens in place of the
  image tokens (same lengths), one engine, run side by side.

Prints a table and writes JSON (default benchmarks/results/vision_language.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __package__ in (None, ""):
    sys.path.insert(0, ROOT)

from pagedjax.benchmarks import machine  # noqa: E402

DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "vision_language.json")
IMAGE_TOKEN = 4095


def build_model(folder: str) -> None:
    """A random LLaVA (SigLIP + Llama) with a word-level tokenizer and image processor."""
    import torch
    import transformers as T
    from tokenizers import Tokenizer, models, pre_tokenizers

    text = T.LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536,
                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    vision = T.SiglipVisionConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=6,
                                  num_attention_heads=6, image_size=224, patch_size=14)
    cfg = T.LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                        vision_feature_select_strategy="full", vision_feature_layer=-1,
                        image_seq_length=256)
    torch.manual_seed(0)
    T.LlavaForConditionalGeneration(cfg).save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(4096)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    T.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", eos_token="w2",
                              bos_token="w1").save_pretrained(folder)
    T.SiglipImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)


def image(seed: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))


def encoder_figures(llm, reps: int) -> dict:
    import jax

    from pagedjax import SamplingParams

    eng = llm.llm_engine
    proc = eng.mm_processor
    _, items = proc.process([1, IMAGE_TOKEN], {"image": image(0)})
    data = items[0].data
    jax.block_until_ready(eng.runner.encode_item(data))  # compile
    t0 = time.perf_counter()
    for _ in range(reps):
        jax.block_until_ready(eng.runner.encode_item(data))
    enc = (time.perf_counter() - t0) / reps
    # A 272-token prompt with one image: its prefill steps, the image already cached.
    ids = [1] + list(range(10, 17)) + [IMAGE_TOKEN] + list(range(20, 28))
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    p = {"prompt_token_ids": ids, "multi_modal_data": {"image": image(0)},
         "cache_salt": "warm"}
    llm.generate(p, params, use_tqdm=False)  # compile the step shapes
    times = []
    for r in range(reps):
        p["cache_salt"] = f"r{r}"  # no prefix-cache hit: the whole prompt is computed
        t0 = time.perf_counter()
        llm.generate(p, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
    step = min(times)
    return {"encoder_ms_per_image": enc * 1e3, "prefill_ms_272_tokens": step * 1e3,
            "encoder_share": enc / (enc + step)}


def workload(n: int, with_images: bool) -> list[dict]:
    out = []
    for i in range(n):
        head = [1] + [100 + (i * 7 + k) % 3000 for k in range(15)]
        if with_images and i % 2 == 0:
            out.append({"prompt_token_ids": head + [IMAGE_TOKEN],
                        "multi_modal_data": {"image": image(100 + i)}})
        else:
            filler = [200 + (i * 13 + k) % 3000 for k in range(256)] if i % 2 == 0 else []
            out.append({"prompt_token_ids": head + filler})
    return out


def throughput(llm, n: int, max_tokens: int, with_images: bool) -> dict:
    from pagedjax import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    reqs = workload(n, with_images)
    t0 = time.perf_counter()
    outs = llm.generate(reqs, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    tokens = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": dt, "tokens": tokens, "tok_per_s": tokens / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=DEFAULT_JSON)
    a = ap.parse_args()
    from pagedjax import LLM, SamplingParams

    folder = tempfile.mkdtemp(prefix="pagedjax-vlm-")
    build_model(folder)
    llm = LLM(folder, max_model_len=512, num_pages=1200, max_num_seqs=16,
              max_num_batched_tokens=512, page_size=16)
    res = {"machine": machine.machine()}
    res.update(encoder_figures(llm, a.reps))
    cache = llm.llm_engine.encoder_cache
    h0, m0 = cache.hits, cache.misses
    reqs = [{"prompt_token_ids": [1, 50 + i, IMAGE_TOKEN],
             "multi_modal_data": {"image": image(200 + i % 2)}} for i in range(a.requests)]
    llm.generate(reqs, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    res["cache_hits"], res["cache_misses"] = cache.hits - h0, cache.misses - m0
    throughput(llm, 4, 2, True)  # compile the mixed shapes
    throughput(llm, 4, 2, False)
    res["mixed"] = throughput(llm, a.requests, a.max_tokens, True)
    res["text_only"] = throughput(llm, a.requests, a.max_tokens, False)
    res["mixed_vs_text"] = res["mixed"]["tok_per_s"] / res["text_only"]["tok_per_s"]
    rows = [("encoder ms per image (256 patches)", f"{res['encoder_ms_per_image']:.1f}"),
            ("prefill of a 272-token prompt with one image, ms", f"{res['prefill_ms_272_tokens']:.1f}"),
            ("encoder share of an image's work", f"{res['encoder_share']:.0%}"),
            (f"encoder cache: {a.requests} requests, 2 images", f"{res['cache_hits']} hits / "
                                                               f"{res['cache_misses']} misses"),
            ("mixed text/image tok/s", f"{res['mixed']['tok_per_s']:.0f}"),
            ("text only tok/s (same lengths)", f"{res['text_only']['tok_per_s']:.0f}"),
            ("mixed / text only", f"{res['mixed_vs_text']:.2f}")]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
