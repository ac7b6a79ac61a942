"""Quantized weights: kept quantized on the device, dequantized inside the step.

A quantized weight is a few arrays ("components") that replace one float
weight of logical shape ``shape`` whose quantization runs along ``axis`` (the
input axis: 0 for a kernel [In, *Out], -1 for an embedding [V, H]). Blocks of
32 (256 for the K-quants) run along that axis; a component's shape is
``shape`` with that axis divided by the factor in ``FORMATS``:

    int8   q i8 (1)                          scale f32 (axis removed)   per channel, symmetric
    q8_0   q i8 (1)   d f16 (32)                                        w = q * d
    q4_0   qs u8 (2)  d f16 (32)                                        w = (nibble - 8) * d
    q4_1   qs u8 (2)  d f16 (32)  m f16 (32)                            w = nibble * d + m
    q4_k   qs u8 (2)  sc u8 (32)  mn u8 (32)  d f16 (256)  dmin f16 (256)
                                                                        w = d*sc*nibble - dmin*mn
    q6_k   ql u8 (2)  qh u8 (4)   sc i8 (16)  d f16 (256)               w = d*sc*(q6 - 32)

Nibbles: byte j of each 32-block holds element j (low 4 bits) and j+16 (high),
llama.cpp's Q4_0/Q4_1 order. q6_k's two high bits: byte j of each 32-block's
8 bytes holds elements j, j+8, j+16, j+24 at bits 0, 2, 4, 6. The GGUF loader
repacks Q4_K and Q6_K super-blocks into these layouts bit for bit, so the
weights' memory is the file's (within 3%: Q4_K keeps its 6-bit sub-block
scales in bytes) and dequantizing gives exactly what ``gguf.quants`` gives.

``dequantize`` runs in the step (jnp); ``quantize_int8`` and ``repack_gguf``
run at load time (numpy).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# kind -> {component: (dtype, divisor of the quantized axis, or 0 = axis removed)}
FORMATS: dict[str, dict[str, tuple[str, int]]] = {
    "int8": {"q": ("int8", 1), "scale": ("float32", 0)},
    "q8_0": {"q": ("int8", 1), "d": ("float16", 32)},
    "q4_0": {"qs": ("uint8", 2), "d": ("float16", 32)},
    "q4_1": {"qs": ("uint8", 2), "d": ("float16", 32), "m": ("float16", 32)},
    "q4_k": {"qs": ("uint8", 2), "sc": ("uint8", 32), "mn": ("uint8", 32),
             "d": ("float16", 256), "dmin": ("float16", 256)},
    "q6_k": {"ql": ("uint8", 2), "qh": ("uint8", 4), "sc": ("int8", 16),
             "d": ("float16", 256)},
}
BLOCK = {"int8": 1, "q8_0": 32, "q4_0": 32, "q4_1": 32, "q4_k": 256, "q6_k": 256}
GGUF_KINDS = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q4_K": "q4_k", "Q6_K": "q6_k"}
QUANTIZATIONS = (None, "int8")  # EngineArgs.quantization (GGUF files keep their own)


def component_shapes(kind: str, shape: tuple[int, ...], axis: int) -> dict[str, tuple]:
    """Component name -> shape for a weight of ``shape`` quantized along ``axis``."""
    axis = axis % len(shape)
    if shape[axis] % BLOCK[kind]:
        raise ValueError(f"{kind}: axis {axis} of {shape} is not a multiple of {BLOCK[kind]}")
    out = {}
    for name, (_, div) in FORMATS[kind].items():
        if div == 0:
            out[name] = shape[:axis] + shape[axis + 1:]
        else:
            out[name] = shape[:axis] + (shape[axis] // div,) + shape[axis + 1:]
    return out


def component_dtypes(kind: str) -> dict[str, np.dtype]:
    return {name: np.dtype(dt) for name, (dt, _) in FORMATS[kind].items()}


# ----------------------------------------------------------------------------- device side


def _nibbles(qs: jax.Array) -> jax.Array:  # u8[In/2, R] -> u8[In/32, 32, R]
    b = qs.reshape((qs.shape[0] // 16, 16) + qs.shape[1:])
    return jnp.concatenate([b & 15, b >> 4], axis=1)


def _per(x: jax.Array, n: int) -> jax.Array:  # [In/n, R] -> f32 [In/n, 1, R]
    return x.astype(jnp.float32)[:, None]


def _dequant_axis0(kind: str, c: dict, dtype) -> jax.Array:
    """Components with the quantized axis first ([In_c, R...]) -> [In, R...]."""
    f32 = jnp.float32
    if kind == "int8":
        return (c["q"].astype(f32) * c["scale"].astype(f32)).astype(dtype)
    if kind == "q8_0":
        q = c["q"]
        w = q.reshape((q.shape[0] // 32, 32) + q.shape[1:]).astype(f32) * _per(c["d"], 32)
    elif kind == "q4_0":
        w = (_nibbles(c["qs"]).astype(jnp.int8) - 8).astype(f32) * _per(c["d"], 32)
    elif kind == "q4_1":
        w = _per(c["d"], 32) * _nibbles(c["qs"]).astype(f32) + _per(c["m"], 32)
    elif kind == "q4_k":
        d = jnp.repeat(c["d"].astype(f32), 8, axis=0)  # per 32-block
        dmin = jnp.repeat(c["dmin"].astype(f32), 8, axis=0)
        scale = (d * c["sc"].astype(f32))[:, None]
        w = scale * _nibbles(c["qs"]).astype(f32) - (dmin * c["mn"].astype(f32))[:, None]
    elif kind == "q6_k":
        lo = _nibbles(c["ql"])  # [In/32, 32, R]
        qh = c["qh"].reshape((c["qh"].shape[0] // 8, 8) + c["qh"].shape[1:])
        hi = jnp.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=1)  # [In/32, 32, R]
        q = ((lo | (hi << 4)).astype(jnp.int8) - 32).astype(f32)
        q = q.reshape((q.shape[0] * 2, 16) + q.shape[2:])  # 16-element scale groups
        scale = jnp.repeat(c["d"].astype(f32), 16, axis=0) * c["sc"].astype(f32)
        w = scale[:, None] * q
    else:
        raise ValueError(f"quantized weight kind {kind!r} is not one of {sorted(FORMATS)}")
    return w.reshape((w.shape[0] * w.shape[1],) + w.shape[2:]).astype(dtype)


def dequantize(kind: str, comps: dict, axis: int, dtype) -> jax.Array:
    """The float weight (logical shape) of ``comps`` quantized along ``axis`` (0 or -1)."""
    if axis == 0:
        return _dequant_axis0(kind, comps, dtype)
    moved = {k: jnp.moveaxis(v, -1, 0) if v.ndim == comps_ndim(comps) else v
             for k, v in comps.items()}
    return jnp.moveaxis(_dequant_axis0(kind, moved, dtype), 0, -1)


def comps_ndim(comps: dict) -> int:
    return max(v.ndim for v in comps.values())


# ----------------------------------------------------------------------------- host side


def quantize_int8(w: np.ndarray, axis: int) -> dict[str, np.ndarray]:
    """Per-channel symmetric int8: one f32 scale per slice across ``axis``."""
    w = np.asarray(w, np.float32)
    amax = np.max(np.abs(w), axis=axis, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return {"q": q, "scale": np.squeeze(scale, axis=axis)}


def _f16(raw: np.ndarray) -> np.ndarray:  # u8[..., 2] -> f16[...]
    return np.ascontiguousarray(raw).view(np.float16)[..., 0]


def _pack_nibbles(e: np.ndarray) -> np.ndarray:  # u8[..., n*32] values 0..15 -> u8[..., n*16]
    b = e.reshape(e.shape[:-1] + (-1, 2, 16))
    return (b[..., 0, :] | (b[..., 1, :] << 4)).reshape(e.shape[:-1] + (-1,))


def _q4k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes of 6-bit (scale, min) pairs -> u8 sc[..., 8], mn[..., 8] (llama.cpp order)."""
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, mn


def repack_gguf(kind: str, raw: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """GGUF blocks of a tensor with rows of ``n`` values (u8[rows, bytes]) -> our
    components in the row layout [rows, n_c] (the quantized axis last)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, n // BLOCK[kind], -1)
    if kind == "q8_0":
        return {"q": blocks[..., 2:].view(np.int8).reshape(rows, n), "d": _f16(blocks[..., 0:2])}
    if kind == "q4_0":
        return {"qs": blocks[..., 2:].reshape(rows, n // 2), "d": _f16(blocks[..., 0:2])}
    if kind == "q4_1":
        return {"qs": blocks[..., 4:].reshape(rows, n // 2), "d": _f16(blocks[..., 0:2]),
                "m": _f16(blocks[..., 2:4])}
    if kind == "q4_k":
        sc, mn = _q4k_scales(blocks[..., 4:16])
        q = blocks[..., 16:].reshape(rows, -1, 4, 32)  # 4 groups of 64 values
        e = np.stack([q & 15, q >> 4], axis=3).reshape(rows, n)  # value order
        return {"qs": _pack_nibbles(e), "sc": sc.reshape(rows, -1), "mn": mn.reshape(rows, -1),
                "d": _f16(blocks[..., 0:2]), "dmin": _f16(blocks[..., 2:4])}
    if kind == "q6_k":
        ql = blocks[..., 0:128].reshape(rows, -1, 2, 64)
        qh = blocks[..., 128:192].reshape(rows, -1, 2, 32)
        lo = np.stack([ql & 15, ql >> 4], axis=3).reshape(rows, -1, 256)
        hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3).reshape(rows, -1, 256)
        hi32 = hi.reshape(rows, -1, 4, 8)  # per 32-block: elements j + 8*s
        packed_hi = (hi32[..., 0, :] | (hi32[..., 1, :] << 2) | (hi32[..., 2, :] << 4)
                     | (hi32[..., 3, :] << 6))
        return {"ql": _pack_nibbles(lo.reshape(rows, n)), "qh": packed_hi.reshape(rows, n // 4),
                "sc": blocks[..., 192:208].view(np.int8).reshape(rows, -1),
                "d": _f16(blocks[..., 208:210])}
    raise ValueError(f"GGUF repack: {kind!r} is not one of {sorted(GGUF_KINDS.values())}")
