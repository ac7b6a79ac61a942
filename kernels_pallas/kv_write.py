"""KV page pool layout and the scatter of new K/V into pages.

Layout (one array per layer; the engine keeps a tuple of them):

    kv_pages  [num_pages, page_size, 2 * num_kv_heads, head_dim]

Along axis 2, K and V of each KV head are interleaved: index ``2*h`` holds the
key of head ``h`` and ``2*h + 1`` its value. Interleaving keeps one head's K and
V together, so splitting axis 2 into N equal parts (tensor parallelism) gives
each device whole heads, and a TPU kernel can DMA one page of one head's K and
V in a single copy.

Page 0 is the null page: padded tokens write there (slot 0), padded
page-table entries point there, and nothing valid is ever read from it.

Quantized caches (``int8`` or ``float8_e4m3fn``) carry a per-token, per-head
scale beside the data:

    kv_scales [num_pages, page_size, 2 * num_kv_heads]  float32

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
    "int8": jnp.int8,
    "fp8": jnp.float8_e4m3fn,
    "fp8_e4m3": jnp.float8_e4m3fn,
}


def is_quantized(dtype) -> bool:
    """True if ``dtype`` is a quantized KV cache dtype (needs scales)."""
    return jnp.dtype(dtype) in _QMAX


def interleave_kv(k: jax.Array, v: jax.Array) -> jax.Array:
    """k, v [T, Hkv, D] -> [T, 2*Hkv, D] with K at even, V at odd indices."""
    t, h, d = k.shape
    return jnp.stack([k, v], axis=2).reshape(t, 2 * h, d)


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
    kv_pages: jax.Array,  # [num_pages, page_size, 2*Hkv, D]
    kv_scales: jax.Array | None,  # [num_pages, page_size, 2*Hkv] f32 or None
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # i32[T]
) -> tuple[jax.Array, jax.Array | None]:
    """Scatter the new tokens' K/V into their slots. Returns the updated pool.

    Under ``jit`` with the pool donated this is an in-place update.
    """
    num_pages, page_size, two_h, d = kv_pages.shape
    if k.shape != v.shape or k.ndim != 3 or 2 * k.shape[1] != two_h or k.shape[2] != d:
        raise ValueError(
            f"k/v: expected [T, {two_h // 2}, {d}] each to match kv_pages {kv_pages.shape}, "
            f"got k {k.shape} and v {v.shape}"
        )
    kv = interleave_kv(k, v)  # [T, 2*Hkv, D]
    flat = kv_pages.reshape(num_pages * page_size, two_h, d)
    if kv_scales is None:
        flat = flat.at[slot_mapping].set(kv.astype(kv_pages.dtype), mode="drop")
        return flat.reshape(kv_pages.shape), None
    data, scale = quantize(kv, kv_pages.dtype)
    flat = flat.at[slot_mapping].set(data, mode="drop")
    sflat = kv_scales.reshape(num_pages * page_size, two_h)
    sflat = sflat.at[slot_mapping].set(scale, mode="drop")
    return flat.reshape(kv_pages.shape), sflat.reshape(kv_scales.shape)


def copy_pages(
    kv_pages: jax.Array,  # [num_pages, page_size, 2*Hkv, D]
    kv_scales: jax.Array | None,
    src: jax.Array,  # i32[C]
    dst: jax.Array,  # i32[C]
) -> tuple[jax.Array, jax.Array | None]:
    """Copy whole pages src[i] -> dst[i] (copy-on-write). Pad with (0, 0)."""
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
) -> tuple[tuple[jax.Array, jax.Array | None], ...]:
    """One zero-filled (pages, scales) pair per layer."""
    out = []
    for _ in range(num_layers):
        pages = jnp.zeros((num_pages, page_size, 2 * num_kv_heads, head_dim), dtype)
        scales = (
            jnp.ones((num_pages, page_size, 2 * num_kv_heads), jnp.float32)
            if is_quantized(dtype)
            else None
        )
        out.append((pages, scales))
    return tuple(out)
