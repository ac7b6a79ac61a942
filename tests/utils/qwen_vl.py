"""A tiny random Qwen2.5-VL saved as an HF folder, with a word-level tokenizer and a
Qwen2-VL image processor, for the M-RoPE vision-language tests."""

from __future__ import annotations

import numpy as np

VOCAB = 128
IMAGE_TOKEN = 9  # "w9"
VISION_START, VISION_END = 11, 12
PATCH = 4
MERGE = 2
MIN_PIXELS = (PATCH * MERGE) ** 2 * 4
MAX_PIXELS = (PATCH * MERGE) ** 2 * 48


def tiny_qwen_vl(seed: int = 0):
    """A tiny random transformers Qwen2_5_VLForConditionalGeneration (eval mode):
    window attention over 2 x 2 merge blocks, full attention in vision layer 1."""
    import torch
    import transformers as T

    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3]})
    vision = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, in_channels=3,
                  patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2,
                  window_size=PATCH * MERGE * 2, fullatt_block_indexes=[1], out_hidden_size=64,
                  hidden_act="silu")
    cfg = T.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
                             video_token_id=10, vision_start_token_id=VISION_START,
                             vision_end_token_id=VISION_END, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = T.Qwen2_5_VLForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln_q" in name):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


def image_processor():
    import transformers as T

    return T.Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2,
                                      size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})


SPECIAL = {IMAGE_TOKEN: "<|image_pad|>", VISION_START: "<|vision_start|>",
           VISION_END: "<|vision_end|>"}
# Each message's content, then the assistant turn (image parts arrive as the
# placeholder text <|vision_start|><|image_pad|><|vision_end|> between newlines).
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def save_tokenizer(folder: str) -> None:
    """A word-level tokenizer ("w0".."w127") whose ids 9, 11 and 12 are Qwen's image
    special tokens, with a plain chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {SPECIAL.get(i, f"w{i}"): i for i in range(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t in SPECIAL.values()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", eos_token="w2",
                                   bos_token="w1")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def save_tiny_qwen_vl(folder: str, seed: int = 0):
    """The model, its word-level tokenizer and image processor saved in ``folder``."""
    model = tiny_qwen_vl(seed)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    image_processor().save_pretrained(folder)
    return model


def hf_inputs(images) -> dict:
    """The reference image processor's numpy outputs (pixel_values, image_grid_thw)."""
    out = image_processor()(images=images, return_tensors="np")
    return {"pixel_values": np.asarray(out["pixel_values"], np.float32),
            "image_grid_thw": np.asarray(out["image_grid_thw"])}


def tokens_of(grid) -> int:
    return int(np.prod(grid)) // MERGE**2


def prompt_ids(grids, text=(5, 6)) -> list[int]:
    """[bos, text..., (vision_start, pads, vision_end, 7 + i, 8) per image]."""
    ids = [1, *text]
    for i, g in enumerate(grids):
        ids += [VISION_START] + [IMAGE_TOKEN] * tokens_of(g) + [VISION_END, 7 + i, 8]
    return ids


def hf_logits(model, ids, inputs) -> np.ndarray:
    import torch

    t = torch.tensor([ids])
    with torch.no_grad():
        out = model(input_ids=t, pixel_values=torch.tensor(inputs["pixel_values"]),
                    image_grid_thw=torch.tensor(inputs["image_grid_thw"]),
                    mm_token_type_ids=(t == IMAGE_TOKEN).int())
    return out.logits[0].numpy()


def hf_greedy(model, ids, inputs, max_new_tokens: int) -> list[int]:
    import torch

    t = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=t, pixel_values=torch.tensor(inputs["pixel_values"]),
                             image_grid_thw=torch.tensor(inputs["image_grid_thw"]),
                             mm_token_type_ids=(t == IMAGE_TOKEN).int(),
                             attention_mask=torch.ones_like(t),
                             max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(ids):].tolist()
