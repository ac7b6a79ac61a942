"""Qwen2ForCausalLM: the Llama layout with q/k/v biases (no o_proj bias).

Parameter tree as in ``llama.py``, plus ``layers[i].attn.qkv_proj.bias [Hkv, G+2, D]``.
Sliding-window layers follow ``layer_types`` or, in older configs,
``use_sliding_window`` with ``max_window_layers``.
"""

from __future__ import annotations

import jax.numpy as jnp

from models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    architecture = "Qwen2ForCausalLM"
    default_tie_word_embeddings = False

    def __init__(self, config: dict, dtype=jnp.float32, eos_token_ids=None):
        super().__init__(config, dtype, eos_token_ids)
        self.qkv_bias = True  # Qwen2 always has q/k/v biases ...
        self.o_bias = False  # ... and never an o_proj bias

    def _sliding_windows(self):
        window = self.cfg.get("sliding_window")
        if not self.cfg.get("use_sliding_window", False) or window is None:
            return (None,) * self.num_layers
        if self.config.get("layer_types"):
            return super()._sliding_windows()
        first = int(self.cfg.get("max_window_layers", self.num_layers))
        return tuple(int(window) if i >= first else None for i in range(self.num_layers))
