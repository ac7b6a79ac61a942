"""LlavaForConditionalGeneration with a SigLIP vision tower: images through the tower
(``models/siglip.py``), a two-layer projector into the text model's hidden size, and
a Llama text model (``models/llama.py``) whose image placeholder tokens take the
projected image embeddings.

An image becomes ``mm_tokens_per_image`` placeholder tokens (``image_token_id``)
in the prompt; :meth:`encode_images` is its own program (the engine runs it once
per image and caches the output), and the decoder step merges its rows into the
token embeddings (``models/common.py merge_embeddings``).

State: the Llama state (``models/llama.py``) plus

    vision_tower.*                         (models/siglip.py)
    projector.linear_1.kernel [Dv, H], .bias [H]
    projector.linear_2.kernel [H, H], .bias [H]

HF names (transformers >= 5): ``model.language_model.*``, ``model.vision_tower.vision_model.*``,
``model.multi_modal_projector.*``, ``lm_head.weight``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from pagedjax.models import layers as L
from pagedjax.models import nn
from pagedjax.models.base import DEFAULT_PLAN, ExecutionPlan
from pagedjax.models.common import ConfigReader, WeightSpec, hf, hf_linear
from pagedjax.models.llama import LlamaForCausalLM
from pagedjax.models.siglip import SiglipVisionTower

VISION_TOWERS = ("siglip_vision_model",)


class LlavaProjector(nnx.Module):
    def __init__(self, d_in: int, d_out: int, act: str, bias: bool, dtype):
        self.linear_1 = nn.Linear(d_in, d_out, (None, "embed"), bias=bias, dtype=dtype)
        self.linear_2 = nn.Linear(d_out, d_out, (None, "embed"), bias=bias, dtype=dtype)
        self.act = L.activation(act)

    def __call__(self, x: jax.Array, plan: ExecutionPlan) -> jax.Array:  # [R, Dv] -> [R, H]
        return self.linear_2(self.act(self.linear_1(x, plan)), plan)


class LlavaForConditionalGeneration(LlamaForCausalLM):
    architecture = "LlavaForConditionalGeneration"
    supports_lora = False
    # The same tensors under the names older checkpoints (and transformers' save) use.
    checkpoint_aliases = {
        "model.language_model.": ("language_model.model.",),
        "lm_head.": ("language_model.lm_head.",),
        "model.vision_tower.vision_model.": ("vision_tower.vision_model.", "vision_tower."),
        "model.multi_modal_projector.": ("multi_modal_projector.",),
    }

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        c = ConfigReader(dict(config), self.architecture)
        text = dict(c.require("text_config"))
        text.setdefault("tie_word_embeddings", bool(c.get("tie_word_embeddings", False)))
        for key in ("eos_token_id", "bos_token_id"):
            if text.get(key) is None and c.config.get(key) is not None:
                text[key] = c.config[key]
        super().__init__(text, dtype=dtype, rngs=rngs)
        vision = dict(c.require("vision_config"))
        kind = vision.get("model_type", "siglip_vision_model")
        if kind not in VISION_TOWERS:
            raise c.unsupported("vision_config.model_type", kind,
                                f"supported vision towers: {', '.join(VISION_TOWERS)}")
        layer = c.get("vision_feature_layer", -2)
        if not isinstance(layer, int):
            raise c.unsupported("vision_feature_layer", layer, "one layer index")
        strategy = c.get("vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise c.unsupported("vision_feature_select_strategy", strategy, "'default' or 'full'")
        self.image_token_id = int(c.get("image_token_id", c.get("image_token_index", 32000)))
        self.vision_tower = SiglipVisionTower(vision, layer, dtype=dtype)
        self.drop_first = strategy == "default"  # HF drops the first (CLS) position
        self.mm_tokens_per_image = self.vision_tower.num_patches - int(self.drop_first)
        self.image_size = self.vision_tower.image_size
        self.projector = LlavaProjector(self.vision_tower.hidden_size, self.hidden_size,
                                        c.get("projector_hidden_act", "gelu"),
                                        bool(c.get("multimodal_projector_bias", True)), dtype)

    def encoder_warmup_data(self, max_patches: int | None = None) -> list:
        """Encoder data of one image of the tower's one size (zeros; for compiling the
        encoder ahead of time)."""
        import numpy as np

        s, c = self.image_size, self.vision_tower.channels
        return [np.zeros((c, s, s), np.float32)]

    def encode_images(self, pixel_values: jax.Array,
                      plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:
        """f32[N, C, S, S] -> [N, mm_tokens_per_image, H]: the placeholders' embeddings."""
        feats = self.vision_tower(pixel_values, plan)  # [N, P, Dv]
        if self.drop_first:
            feats = feats[:, 1:]
        n, p, d = feats.shape
        return self.projector(feats.reshape(n * p, d), plan).reshape(n, p, -1)

    def weight_map(self) -> dict:
        out = {}
        for key, spec in super().weight_map().items():
            names = tuple("model.language_model." + n[len("model."):] if n.startswith("model.")
                          else n for n in spec.names)
            out[key] = WeightSpec(names, spec.fn)
        out.update(self.vision_tower.weight_map("model.vision_tower.vision_model.",
                                                "vision_tower."))
        pr = "model.multi_modal_projector."
        for i in (1, 2):
            out[f"projector.linear_{i}.kernel"] = hf_linear(f"{pr}linear_{i}.weight")
            if self.projector.linear_1.bias is not None:
                out[f"projector.linear_{i}.bias"] = hf(f"{pr}linear_{i}.bias")
        return out
