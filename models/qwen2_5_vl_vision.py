"""The Qwen2.5-VL vision tower (``Qwen2_5_VisionTransformerPretrainedModel``): patches of
one image -> the merged image tokens the language model reads (``models/qwen2_5_vl.py``).

An image arrives as the image processor's flattened patches (``pixel_values
f32[P, C*T*p*p]``, P = gh * gw patches in the processor's order: 2 x 2 merge blocks
row-major, the patches of a block consecutive) and its grid ``(1, gh, gw)``. The
tower runs over a static *patch bucket* (P padded to a power of two): the host side
(:func:`encoder_inputs`) builds, per bucket slot, the patch, its (row, column) for the
2D rotary and the window it belongs to; padding slots see only themselves.

* 2D rotary: a quarter of the head dimension's frequencies rotate by the row, a
  quarter by the column (both halves of the neox layout, as HF).
* Window attention: the layers not in ``fullatt_block_indexes`` attend within windows
  of ``window_size`` pixels (in 2 x 2 merge blocks); the others over the whole image.
  As in HF the patches are reordered window by window (merge blocks stay whole) and
  a window id masks the attention; on large buckets the queries go by blocks of
  ``QUERY_BLOCK``, and in window layers a block reads only the keys within the
  longest window of it (windows are contiguous), so those layers cost O(P) not O(P^2).
  The merged tokens are put back in the image's order at the end.
* Patch merger: RMS norm, four neighbouring patches concatenated, a two-layer MLP
  with GELU into the language model's hidden size.

State (HF names under ``model.visual.`` / ``visual.``):

    patch_embed.kernel [C*T*p*p, D]      (the Conv3d as a matmul, no bias)
    blocks[i].norm1, norm2 (scale) [D]
    blocks[i].qkv.kernel [D, 3, D], .bias [3, D]
    blocks[i].proj.kernel [D, D], .bias [D]
    blocks[i].gate_up.kernel [D, 2, I], .bias [2, I]; down.kernel [I, D], .bias [D]
    merger.ln_q.scale [D]; merger.fc1 [4D, 4D] (+bias), merger.fc2 [4D, H] (+bias)
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

MIN_PATCH_BUCKET = 64
QUERY_BLOCK = 1024  # larger buckets attend block of queries by block (bounded scores)


def patch_bucket(num_patches: int) -> int:
    """The static patch count an image of ``num_patches`` patches is padded to."""
    return max(MIN_PATCH_BUCKET, 1 << max(0, (int(num_patches) - 1).bit_length()))


def _flat(w: np.ndarray) -> np.ndarray:  # Conv3d [D, C, T, p, p] -> [C*T*p*p, D]
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


def _qkv(w: np.ndarray) -> np.ndarray:  # [3D, D] -> [D, 3, D]
    d = w.shape[1]
    return np.ascontiguousarray(w.reshape(3, -1, d).transpose(2, 0, 1))


def _gate_up(g: np.ndarray, u: np.ndarray) -> np.ndarray:  # [I, D] x2 -> [D, 2, I]
    return np.ascontiguousarray(np.stack([g.T, u.T], axis=1))


def _reshape_bias(n: int):
    return lambda b: b.reshape(n, -1)


def _stack_bias(g, u):
    return np.stack([g, u])


def _attend(q, k, v, q_ids, q_pos, k_ids, k_pos, scale):
    """Bidirectional attention of queries [Q, h, d] over keys [P, h, d] within the same
    window / image id (padding, id -1, sees only itself) -> [Q, h, d]."""
    mask = ((q_ids[:, None] == k_ids[None, :]) & (q_ids[:, None] >= 0)) \
        | (q_pos[:, None] == k_pos[None, :])
    s = jnp.einsum("qhd,khd->hqk", q, k).astype(jnp.float32) * scale
    w = jax.nn.softmax(jnp.where(mask[None], s, -jnp.inf), axis=-1).astype(q.dtype)
    return jnp.einsum("hqk,khd->qhd", w, v)


class VisionBlock(nnx.Module):
    def __init__(self, d: int, heads: int, inter: int, act: str, dtype):
        self.heads, self.head_dim = heads, d // heads
        self.norm1 = nn.RMSNorm(d, 1e-6, dtype=dtype)
        self.qkv = nn.Linear(d, (3, d), ("embed", None, "heads"), bias=True, dtype=dtype)
        self.proj = nn.Linear(d, d, ("heads", "embed"), bias=True, dtype=dtype)
        self.norm2 = nn.RMSNorm(d, 1e-6, dtype=dtype)
        self.gate_up = nn.Linear(d, (2, inter), ("embed", None, "mlp"), bias=True, dtype=dtype)
        self.down = nn.Linear(inter, d, ("mlp", "embed"), bias=True, dtype=dtype)
        self.act = L.activation(act)

    def attention(self, x, rope, ids, band, plan):
        """x [P, D]; ids i32[P]: each patch's window or image (-1: padding); ``band``:
        the longest window (patches, contiguous in the layout) or None (full)."""
        p = x.shape[0]
        qkv = self.qkv(x, plan).reshape(p, 3, self.heads, self.head_dim)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [P, h, d]
        q = L.apply_rotary(q.astype(jnp.float32), *rope).astype(x.dtype)
        k = L.apply_rotary(k.astype(jnp.float32), *rope).astype(x.dtype)
        pos = jnp.arange(p)
        scale = self.head_dim**-0.5
        if p <= QUERY_BLOCK:
            return self.proj(_attend(q, k, v, ids, pos, ids, pos, scale).reshape(p, -1), plan)
        # Query blocks one after another: scores [h, QUERY_BLOCK, keys] at a time; a
        # window layer's block reads only the keys its windows can reach.
        nb = p // QUERY_BLOCK
        width = p if band is None or QUERY_BLOCK + 2 * band >= p else QUERY_BLOCK + 2 * band

        def block(b):
            start = jnp.clip(b * QUERY_BLOCK - (band or 0), 0, p - width)
            ks = [jax.lax.dynamic_slice_in_dim(a, start, width) for a in (k, v, ids, pos)]
            qb = [jax.lax.dynamic_slice_in_dim(a, b * QUERY_BLOCK, QUERY_BLOCK)
                  for a in (q, ids, pos)]
            return _attend(qb[0], ks[0], ks[1], qb[1], qb[2], ks[2], ks[3], scale)

        o = jax.lax.map(block, jnp.arange(nb))
        return self.proj(o.reshape(p, -1), plan)

    def __call__(self, x, rope, ids, band, plan):
        x = x + self.attention(self.norm1(x), rope, ids, band, plan)
        gu = self.gate_up(self.norm2(x), plan)
        return x + self.down(self.act(gu[:, 0]) * gu[:, 1], plan)


class PatchMerger(nnx.Module):
    def __init__(self, d: int, out: int, unit: int, dtype):
        self.unit = unit
        self.ln_q = nn.RMSNorm(d, 1e-6, dtype=dtype)
        self.fc1 = nn.Linear(d * unit, d * unit, (None, "mlp"), bias=True, dtype=dtype)
        self.fc2 = nn.Linear(d * unit, out, ("mlp", "embed"), bias=True, dtype=dtype)

    def __call__(self, x, plan):  # [P, D] -> [P / unit, out]
        x = self.ln_q(x).reshape(x.shape[0] // self.unit, -1)
        return self.fc2(jax.nn.gelu(self.fc1(x, plan), approximate=False), plan)


class Qwen2_5_VisionTower(nnx.Module):
    """See the module docstring. ``out_hidden_size``: the language model's hidden size."""

    def __init__(self, vision_config: dict, *, dtype=jnp.float32):
        c = ConfigReader(dict(vision_config), "Qwen2_5_VLVisionConfig")
        self.hidden_size = d = int(c.require("hidden_size"))
        self.depth = int(c.get("depth", c.get("num_hidden_layers", 0)) or c.require("depth"))
        heads = int(c.get("num_heads", c.get("num_attention_heads", 0)) or c.require("num_heads"))
        if d % heads:
            raise c.unsupported("num_heads", heads, f"must divide hidden_size={d}")
        self.head_dim = d // heads
        if self.head_dim % 4:
            raise c.unsupported("num_heads", heads, "the head dimension must be a multiple of 4")
        self.patch_size = int(c.get("patch_size", 14))
        self.temporal_patch_size = int(c.get("temporal_patch_size", 2))
        self.channels = int(c.get("in_channels", 3))
        self.merge = int(c.get("spatial_merge_size", 2))
        self.window_size = int(c.get("window_size", 112))
        self.full_layers = tuple(int(i) for i in c.get("fullatt_block_indexes", ()))
        self.out_hidden_size = int(c.require("out_hidden_size"))
        rope = c.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
        half = self.head_dim // 2  # HF: inv_freq over head_dim / 2, for rows and columns
        self.inv_freq = tuple(float(f) for f in
                              1.0 / theta ** (np.arange(0, half, 2, dtype=np.float64) / half))
        act = c.get("hidden_act", "silu")
        L.activation(act)
        self.dtype = jnp.dtype(dtype)
        kin = self.channels * self.temporal_patch_size * self.patch_size**2
        self.patch_embed = nn.Linear(kin, d, (None, "embed"), dtype=dtype)
        inter = int(c.require("intermediate_size"))
        self.blocks = nnx.List([VisionBlock(d, heads, inter, act, dtype)
                                for _ in range(self.depth)])
        self.merger = PatchMerger(d, self.out_hidden_size, self.merge**2, dtype)

    # -- host side ---------------------------------------------------------------------

    def window_units(self) -> int:
        """Merge blocks per window side."""
        return max(1, self.window_size // self.merge // self.patch_size)

    def encoder_inputs(self, pixel_values: np.ndarray, grid_thw) -> dict:
        """One image (the processor's patches f32[P, K], grid (t, gh, gw)) -> the tower's
        inputs padded to its patch bucket (numpy)."""
        t, gh, gw = (int(v) for v in grid_thw)
        n, m = t * gh * gw, self.merge
        if pixel_values.shape[0] != n:
            raise ValueError(f"pixel_values: {pixel_values.shape[0]} patches for a "
                             f"{t}x{gh}x{gw} grid")
        bucket = patch_bucket(n)
        patches = np.zeros((bucket, pixel_values.shape[1]), np.float32)
        patches[:n] = pixel_values
        # Each patch's (row, column), in the processor's merge-block-major order.
        hh, ww = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        blocks = (gh // m, m, gw // m, m)
        rows = np.tile(hh.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1), t)
        cols = np.tile(ww.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1), t)
        pos = np.zeros((bucket, 2), np.int32)
        pos[:n, 0], pos[:n, 1] = rows, cols
        ws = self.window_units()
        nh, nw = (gh // m) // ws + 1, (gw // m) // ws + 1  # (at least) windows per column, row
        frame = np.repeat(np.arange(t), gh * gw)
        window = np.full(bucket, -1, np.int32)
        window[:n] = (frame * nh + (rows // m) // ws) * nw + (cols // m) // ws
        image = np.full(bucket, -1, np.int32)  # full attention: one frame (HF's segments)
        image[:n] = frame
        # Window by window (HF's order): each window's patches contiguous; merge blocks
        # stay whole, and ``order`` puts the merged tokens back in the image's order.
        unit = m * m
        units = np.argsort(window[:n:unit], kind="stable")
        perm = (units[:, None] * unit + np.arange(unit)).reshape(-1)
        for a in (patches, pos, window, image):
            a[:n] = a[:n][perm]
        order = np.arange(bucket // unit, dtype=np.int32)
        order[:n // unit] = np.argsort(units)
        return {"patches": patches, "pos": pos, "window": window, "image": image,
                "order": order}

    # -- device side -------------------------------------------------------------------

    def _rope(self, pos):  # i32[P, 2] -> cos, sin [P, head_dim / 2]
        inv = jnp.asarray(self.inv_freq, jnp.float32)
        f = pos.astype(jnp.float32)[:, :, None] * inv  # [P, 2, head_dim / 4]
        f = f.reshape(pos.shape[0], -1)
        return jnp.cos(f), jnp.sin(f)

    def __call__(self, inputs: dict, plan: ExecutionPlan = DEFAULT_PLAN) -> jax.Array:
        """The tower's inputs (:meth:`encoder_inputs`) -> [P / 4, out_hidden_size]."""
        x = self.patch_embed(inputs["patches"].astype(self.dtype), plan)
        rope = self._rope(inputs["pos"])
        band = self.window_units() ** 2 * self.merge**2  # patches of the largest window
        for i, block in enumerate(self.blocks):
            full = i in self.full_layers
            x = block(x, rope, inputs["image" if full else "window"], None if full else band,
                      plan)
        return jnp.take(self.merger(x, plan), inputs["order"], axis=0)

    def weight_map(self, hf_prefix: str, prefix: str) -> dict:
        out = {prefix + "patch_embed.kernel": hf_fused(_flat, hf_prefix + "patch_embed.proj.weight")}
        for i in range(self.depth):
            h, me = f"{hf_prefix}blocks.{i}.", f"{prefix}blocks.{i}."
            out.update({
                me + "norm1.scale": hf(h + "norm1.weight"),
                me + "norm2.scale": hf(h + "norm2.weight"),
                me + "qkv.kernel": hf_fused(_qkv, h + "attn.qkv.weight"),
                me + "qkv.bias": hf_fused(_reshape_bias(3), h + "attn.qkv.bias"),
                me + "proj.kernel": hf_linear(h + "attn.proj.weight"),
                me + "proj.bias": hf(h + "attn.proj.bias"),
                me + "gate_up.kernel": hf_fused(_gate_up, h + "mlp.gate_proj.weight",
                                                h + "mlp.up_proj.weight"),
                me + "gate_up.bias": hf_fused(_stack_bias, h + "mlp.gate_proj.bias",
                                              h + "mlp.up_proj.bias"),
                me + "down.kernel": hf_linear(h + "mlp.down_proj.weight"),
                me + "down.bias": hf(h + "mlp.down_proj.bias"),
            })
        m, me = hf_prefix + "merger.", prefix + "merger."
        out.update({me + "ln_q.scale": hf(m + "ln_q.weight"),
                    me + "fc1.kernel": hf_linear(m + "mlp.0.weight"),
                    me + "fc1.bias": hf(m + "mlp.0.bias"),
                    me + "fc2.kernel": hf_linear(m + "mlp.2.weight"),
                    me + "fc2.bias": hf(m + "mlp.2.bias")})
        return out
