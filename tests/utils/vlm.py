"""A tiny random LLaVA (SigLIP tower + Llama) saved as an HF folder, with a word-level
tokenizer and a SigLIP image processor, for the multimodal tests."""

from __future__ import annotations

import numpy as np

VOCAB = 128
IMAGE_TOKEN = 9  # the placeholder token id ("w9": one-digit words tokenize whole)
IMAGE_SIZE = 16
PATCH = 4  # 16 patches per image


def tiny_llava(seed: int = 0, strategy: str = "full", feature_layer: int = -2):
    """A tiny random transformers LlavaForConditionalGeneration (eval mode)."""
    import torch
    import transformers as T

    text = T.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False)
    vision = T.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                  num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                                  num_channels=3)
    cfg = T.LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                        vision_feature_select_strategy=strategy,
                        vision_feature_layer=feature_layer,
                        image_seq_length=(IMAGE_SIZE // PATCH) ** 2 - (strategy == "default"),
                        projector_hidden_act="gelu")
    torch.manual_seed(seed)
    model = T.LlavaForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


def save_tiny_llava(folder: str, seed: int = 0, **kw):
    """The model, its word-level tokenizer and image processor saved in ``folder``."""
    import transformers as T

    from tests.distributed.test_parallel import save_tiny_tokenizer

    model = tiny_llava(seed, **kw)
    model.save_pretrained(folder)
    save_tiny_tokenizer(folder, VOCAB)
    T.SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(folder)
    return model


def random_image(seed: int, size=(23, 19)):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def hf_pixels(folder: str, images) -> np.ndarray:
    import transformers as T

    return T.SiglipImageProcessor.from_pretrained(folder)(images=images, return_tensors="np")[
        "pixel_values"]
