"""KV page pool layout and the scatter of new K/V into pages.

Layout (one array per layer; the engine keeps a tuple of them):

    kv_pages  [num_pages, 2, num_kv_heads, page_size, head_dim]

A page holds K (index 0 on axis 1) and V (index 1) of ``page_size`` tokens,
head-major: the keys of one head on one page are one contiguous
``[page_size, head_dim]`` block. Every backend reads whole blocks:

* the CPU/XLA path gathers ``pool[page_ids, 0]`` straight into the batched
  matmul layout ``[.., num_kv_heads, page_size, head_dim]`` (no transpose);
* a TPU kernel DMAs one page (K and V of all heads) in one copy, and a block's
  last two dims ``(page_size, head_dim)`` match the TPU tile;
* a GPU kernel loads a head's keys of a page as one dense tile.

Splitting axis 2 into N equal parts (tensor parallelism) gives each device
whole heads.

Page 0 is the null page: padded tokens write there (slot 0), padded
page-table entries point there, and nothing valid is ever read from it.

Quantized caches (``int8`` or ``float8_e4m3fn``) carry a per-token, per-head
scale beside the data:

    kv_scales [num_pages, 2, num_kv_heads, page_size]  float32

with ``value ~= data.astype(f32) * scale``. For unquantized caches
``kv_scales`` is ``None``.

A slot is ``page_id * page_size + offset_in_page``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Largest finite magnitude of each quantized cache dtype.
_QMAX = {
    jnp.dtype(jnp.int8): 127.0,
    jnp.dtype(jnp.float8_e4m3fn): 448.0,
}

KV_CACHE_DTYPES = {
    "float16": jnp.float16,
    "int8": jnp.int8,
    "fp8": jnp.float8_e4m3fn,
    "fp8_e4m3": jnp.float8_e4m3fn,
}


def is_quantized(dtype) -> bool:
    """True if ``dtype`` is a quantized KV cache dtype (needs scales)."""
    return jnp.dtype(dtype) in _QMAX


def quantize(x: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """Per-row (last axis) symmetric quantization.

    x [..., D] float -> (data [..., D] dtype, scale [...] float32).
    """
    dtype = jnp.dtype(dtype)
    qmax = _QMAX[dtype]
    xf = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(xf), axis=-1)
    scale = jnp.where(amax > 0, amax / qmax, 1.0).astype(jnp.float32)
    y = xf / scale[..., None]
    if dtype == jnp.dtype(jnp.int8):
        y = jnp.clip(jnp.round(y), -qmax, qmax)
    else:
        y = jnp.clip(y, -qmax, qmax)
    return y.astype(dtype), scale


def dequantize(data: jax.Array, scale: jax.Array | None, dtype=jnp.float32) -> jax.Array:
    """Inverse of :func:`quantize` (identity cast when ``scale`` is None)."""
    if scale is None:
        return data.astype(dtype)
    return (data.astype(jnp.float32) * scale[..., None]).astype(dtype)


def write_kv(
    kv_pages: jax.Array,  # [num_pages, 2, Hkv, page_size, D]
    kv_scales: jax.Array | None,  # [num_pages, 2, Hkv, page_size] f32 or None
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # i32[T]
) -> tuple[jax.Array, jax.Array | None]:
    """Scatter the new tokens' K/V into their slots. Returns the updated pool.

    Under ``jit`` with the pool donated this is an in-place update.
    """
    num_pages, two, hkv, page_size, d = kv_pages.shape
    if k.shape != v.shape or k.ndim != 3 or k.shape[1] != hkv or k.shape[2] != d:
        raise ValueError(
            f"k/v: expected [T, {hkv}, {d}] each to match kv_pages {kv_pages.shape}, "
            f"got k {k.shape} and v {v.shape}"
        )
    kv = jnp.stack([k, v], axis=1)  # [T, 2, Hkv, D]
    page = slot_mapping // page_size
    off = slot_mapping % page_size
    if kv_scales is None:
        kv_pages = kv_pages.at[page, :, :, off].set(kv.astype(kv_pages.dtype), mode="drop")
        return kv_pages, None
    data, scale = quantize(kv, kv_pages.dtype)  # [T, 2, Hkv, D], [T, 2, Hkv]
    kv_pages = kv_pages.at[page, :, :, off].set(data, mode="drop")
    kv_scales = kv_scales.at[page, :, :, off].set(scale, mode="drop")
    return kv_pages, kv_scales


def copy_pages(
    kv_pages: jax.Array,  # [num_pages, 2, Hkv, page_size, D] (or [L, num_pages, ...])
    kv_scales: jax.Array | None,
    src: jax.Array,  # i32[C]
    dst: jax.Array,  # i32[C]
    *,
    layer_axis: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Copy whole pages src[i] -> dst[i] (copy-on-write). Pad with (0, 0).

    ``layer_axis``: the pool stacks all layers on a leading axis (the
    ``scan_layers`` layout); page ids index axis 1 and every layer is copied.
    """
    if layer_axis:
        kv_pages = kv_pages.at[:, dst].set(kv_pages[:, src])
        if kv_scales is not None:
            kv_scales = kv_scales.at[:, dst].set(kv_scales[:, src])
        return kv_pages, kv_scales
    kv_pages = kv_pages.at[dst].set(kv_pages[src])
    if kv_scales is not None:
        kv_scales = kv_scales.at[dst].set(kv_scales[src])
    return kv_pages, kv_scales


def allocate_kv_pages(
    num_layers: int,
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype,
    zeros=None,
) -> tuple[tuple[jax.Array, jax.Array | None], ...]:
    """One zero-filled (pages, scales) pair per layer. ``zeros``: makes the page
    arrays from a list of ``(shape, dtype)`` (``cpu.zero_pages.zeros`` zeroes them
    without writing them); default ``jnp.zeros`` each."""
    shape = (num_pages, 2, num_kv_heads, page_size, head_dim)
    if zeros is None:
        zeros = lambda specs: [jnp.zeros(s, d) for s, d in specs]  # noqa: E731
    all_pages = zeros([(shape, dtype)] * num_layers)
    out = []
    for pages in all_pages:
        scales = (
            jnp.ones((num_pages, 2, num_kv_heads, page_size), jnp.float32)
            if is_quantized(dtype)
            else None
        )
        out.append((pages, scales))
    return tuple(out)
