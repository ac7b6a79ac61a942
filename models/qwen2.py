"""Qwen2ForCausalLM: the Llama layout with q/k/v biases (no o_proj bias), and
Qwen3ForCausalLM: no biases, RMS norms on each query and key head (q_norm, k_norm).

State as in ``llama.py``, plus ``layers[i].attn.qkv_proj.bias [Hkv, G+2, D]``
(Qwen2) or ``layers[i].attn.{q_norm,k_norm}.scale [D]`` (Qwen3). Sliding-window
layers follow ``layer_types`` or, in older configs, ``use_sliding_window``
with ``max_window_layers``.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from pagedjax.models.common import ConfigReader
from pagedjax.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    architecture = "Qwen2ForCausalLM"
    default_tie_word_embeddings = False

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        # Qwen2 always has q/k/v biases and never an o_proj bias.
        super().__init__({**config, "attention_bias": None}, dtype=dtype, rngs=rngs)

    default_qkv_bias = True

    def _sliding_windows(self, c: ConfigReader):
        window = c.get("sliding_window")
        if not c.get("use_sliding_window", False) or window is None:
            return (None,) * self.num_layers
        if c.config.get("layer_types"):
            return super()._sliding_windows(c)
        first = int(c.get("max_window_layers", self.num_layers))
        return tuple(int(window) if i >= first else None for i in range(self.num_layers))


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    architecture = "Qwen3ForCausalLM"
    default_qkv_bias = False
    qk_norm = True

    def __init__(self, config: dict, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        LlamaForCausalLM.__init__(self, config, dtype=dtype, rngs=rngs)
