"""SigLIP vision tower (``SiglipVisionModel``): the image encoder of the vision-language
models (LLaVA-style with a SigLIP tower; see ``models/llava.py``).

A pure function of its parameters and a batch of images of one static size (the
patch bucket): ``pixel_values f32[N, C, S, S] -> hidden f32[N, P, D]`` with
``P = (S / patch)**2`` patches. Bidirectional attention over the patches of one
image, no KV pool.

State (HF names under ``{prefix}vision_model.``):

    embeddings.patch.kernel          [C*p*p, D]   (patch_embedding Conv2d as a matmul)
    embeddings.patch.bias            [D]
    embeddings.position.embedding    [P, D]
    layers[i].layer_norm1, layer_norm2 (scale, bias) [D]
    layers[i].qkv.kernel [D, 3, D], .bias [3, D]   (q/k/v fused)
    layers[i].out_proj.kernel [D, D], .bias [D]
    layers[i].fc1 [D, I], fc2 [I, D] (with biases)
    post_layernorm (scale, bias) [D]  (only when the last layer's output is used)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pagedjax.models import layers as L
from pagedjax.models import nn
from pagedjax.models.base import DEFAULT_PLAN, ExecutionPlan
from pagedjax.models.common import ConfigReader, hf, hf_fused, hf_linear


def _patch_kernel(w: np.ndarray) -> np.ndarray:  # Conv2d [D, C, p, p] -> [C*p*p, D]
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


def _stack3(q, k, v):  # three Linear weights [D, D] -> [D, 3, D]
    return np.ascontiguousarray(np.stack([q.T, k.T, v.T], axis=1))


def _stack3_bias(q, k, v):  # [D] x3 -> [3, D]
    return np.stack([q, k, v])


class SiglipLayer(nnx.Module):
    def __init__(self, d: int, heads: int, inter: int, eps: float, act: str, dtype):
        self.heads, self.head_dim = heads, d // heads
        self.layer_norm1 = nn.LayerNorm(d, eps, dtype=dtype)
        self.qkv = nn.Linear(d, (3, d), ("embed", None, "heads"), bias=True, dtype=dtype)
        self.out_proj = nn.Linear(d, d, ("heads", "embed"), bias=True, dtype=dtype)
        self.layer_norm2 = nn.LayerNorm(d, eps, dtype=dtype)
        self.fc1 = nn.Linear(d, inter, ("embed", "mlp"), bias=True, dtype=dtype)
        self.fc2 = nn.Linear(inter, d, ("mlp", "embed"), bias=True, dtype=dtype)
        self.act = L.activation(act)

    def attention(self, x: jax.Array, n: int, plan: ExecutionPlan) -> jax.Array:
        """x [N*P, D] (N images of P patches each) -> [N*P, D]."""
        qkv = self.qkv(x, plan)  # [N*P, 3, D]
        p = x.shape[0] // n
        qkv = qkv.reshape(n, p, 3, self.heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [N, P, h, d]
        s = jnp.einsum("nqhd,nkhd->nhqk", q, k).astype(jnp.float32) * self.head_dim**-0.5
        w = jax.nn.softmax(s, axis=-1).astype(x.dtype)
        o = jnp.einsum("nhqk,nkhd->nqhd", w, v).reshape(n * p, -1)
        return self.out_proj(o, plan)

    def __call__(self, x: jax.Array, n: int, plan: ExecutionPlan) -> jax.Array:
        x = x + self.attention(self.layer_norm1(x), n, plan)
        return x + self.fc2(self.act(self.fc1(self.layer_norm2(x), plan)), plan)


class SiglipVisionTower(nnx.Module):
    """The SigLIP vision transformer, run up to ``feature_layer`` (HF ``hidden_states``
    index: -1 the last layer's output, -2 the one before, ...)."""

    def __init__(self, vision_config: dict, feature_layer: int, *, dtype=jnp.float32):
        c = ConfigReader(dict(vision_config), "SiglipVisionModel")
        self.hidden_size = d = int(c.require("hidden_size"))
        self.num_layers = int(c.require("num_hidden_layers"))
        self.image_size = int(c.require("image_size"))
        self.patch_size = int(c.require("patch_size"))
        self.channels = int(c.get("num_channels", 3))
        if self.image_size % self.patch_size:
            raise c.unsupported("image_size", self.image_size,
                                f"must be a multiple of patch_size={self.patch_size}")
        self.num_patches = (self.image_size // self.patch_size) ** 2
        heads = int(c.require("num_attention_heads"))
        if d % heads:
            raise c.unsupported("num_attention_heads", heads, f"must divide hidden_size={d}")
        eps = float(c.get("layer_norm_eps", 1e-6))
        act = c.get("hidden_act", "gelu_pytorch_tanh")
        L.activation(act)
        used = feature_layer + 1 + self.num_layers if feature_layer < 0 else feature_layer
        if not 0 <= used <= self.num_layers:
            raise ValueError(f"vision_feature_layer={feature_layer} is outside the vision "
                             f"tower's {self.num_layers} layers")
        self.num_used_layers = used
        self.dtype = jnp.dtype(dtype)
        kin = self.channels * self.patch_size**2
        self.patch = nn.Linear(kin, d, (None, "embed"), bias=True, dtype=dtype)
        self.position = nn.Embed(self.num_patches, d, dtype=dtype, axes=("pos", "embed"))
        inter = int(c.require("intermediate_size"))
        self.layers = nnx.List([SiglipLayer(d, heads, inter, eps, act, dtype)
                                for _ in range(used)])

    def patches(self, pixel_values: jax.Array) -> jax.Array:
        """f32[N, C, S, S] -> [N*P, C*p*p], patches in row-major order (Conv2d's layout)."""
        n, ch, s, _ = pixel_values.shape
        p, g = self.patch_size, s // self.patch_size
        x = pixel_values.reshape(n, ch, g, p, g, p).transpose(0, 2, 4, 1, 3, 5)
        return x.reshape(n * g * g, ch * p * p)

    def __call__(self, pixel_values: jax.Array,
                 plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:  # -> [N, P, D]
        n = pixel_values.shape[0]
        if pixel_values.shape[1:] != (self.channels, self.image_size, self.image_size):
            raise ValueError(f"pixel_values: expected [N, {self.channels}, {self.image_size}, "
                             f"{self.image_size}], got {tuple(pixel_values.shape)}")
        x = self.patch(self.patches(pixel_values.astype(self.dtype)), plan)
        pos = self.position(jnp.arange(self.num_patches))
        x = (x.reshape(n, self.num_patches, -1) + pos[None]).reshape(n * self.num_patches, -1)
        for layer in self.layers:
            x = layer(x, n, plan)
        return x.reshape(n, self.num_patches, -1)

    def weight_map(self, hf_prefix: str, prefix: str) -> dict:
        """{our path: WeightSpec} with HF names under ``hf_prefix`` (``...vision_model.``)
        and our paths under ``prefix`` (the tower's attribute path, dotted)."""
        e = hf_prefix + "embeddings."
        out = {prefix + "patch.kernel": hf_fused(_patch_kernel, e + "patch_embedding.weight"),
               prefix + "patch.bias": hf(e + "patch_embedding.bias"),
               prefix + "position.embedding": hf(e + "position_embedding.weight")}
        for i in range(self.num_used_layers):
            h, me = f"{hf_prefix}encoder.layers.{i}.", f"{prefix}layers.{i}."
            a = h + "self_attn."
            out.update({
                me + "layer_norm1.scale": hf(h + "layer_norm1.weight"),
                me + "layer_norm1.bias": hf(h + "layer_norm1.bias"),
                me + "layer_norm2.scale": hf(h + "layer_norm2.weight"),
                me + "layer_norm2.bias": hf(h + "layer_norm2.bias"),
                me + "qkv.kernel": hf_fused(_stack3, *(a + f"{x}_proj.weight" for x in "qkv")),
                me + "qkv.bias": hf_fused(_stack3_bias, *(a + f"{x}_proj.bias" for x in "qkv")),
                me + "out_proj.kernel": hf_linear(a + "out_proj.weight"),
                me + "out_proj.bias": hf(a + "out_proj.bias"),
                me + "fc1.kernel": hf_linear(h + "mlp.fc1.weight"),
                me + "fc1.bias": hf(h + "mlp.fc1.bias"),
                me + "fc2.kernel": hf_linear(h + "mlp.fc2.weight"),
                me + "fc2.bias": hf(h + "mlp.fc2.bias"),
            })
        return out
