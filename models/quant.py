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

``chunked_matmul`` / ``chunked_matmul_t`` run in the step (jnp): they dequantize
a weight a chunk at a time inside a ``lax.scan`` (see ``CHUNK_BYTES`` for why) in
matmuls of at most ``CHUNK_MAX_ROWS`` rows;
``dequantize`` gives a whole float weight; ``quantize_int8`` and ``repack_gguf``
run at load time (numpy).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (numpy's float8 dtypes)
import numpy as np

# kind -> {component: (dtype, divisor of the quantized axis, or 0 = axis removed)}
FORMATS: dict[str, dict[str, tuple[str, int]]] = {
    "int8": {"q": ("int8", 1), "scale": ("float32", 0)},
    "fp8": {"q": ("float8_e4m3fn", 1), "scale": ("float32", 0)},
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
PER_CHANNEL = ("int8", "fp8")  # one scale per output channel, applied after the dot
QUANTIZATIONS = (None, "int8")  # EngineArgs.quantization (GGUF files keep their own)


def formats(kind: str) -> dict[str, tuple[str, int]]:
    """The component table of any kind: ``FORMATS``' and the published checkpoints'
    grouped kinds (models/checkpoint_quant.py writes them)::

        fp8             q f8e4m3 (1)   scale f32 (axis removed)           w = q * scale
        fp8_g{B}        q f8e4m3 (1)   s f32 (B)                          w = q * s
        int4_g{G}       qs u8 (2)      s f32 (G)   z u8 (G)               w = s * (nibble - z)
        int4_g{G}_perm  the same + perm i32 (only the quantized axis): x's columns
                        gathered by perm first (GPTQ act-order, rows in group order)

    int4 nibbles are in Q4_0's order (byte j of each 32-block: elements j, j+16)."""
    if kind in FORMATS:
        return FORMATS[kind]
    base, group, perm = parse_kind(kind)
    if base == "fp8":
        return {"q": ("float8_e4m3fn", 1), "s": ("float32", group)}
    table = {"qs": ("uint8", 2), "s": ("float32", group), "z": ("uint8", group)}
    return {**table, "perm": ("int32", -1)} if perm else table


def parse_kind(kind: str) -> tuple[str, int, bool]:
    """``int4_g128_perm`` -> ("int4", 128, True); ValueError for an unknown kind."""
    m = re.fullmatch(r"(int4|fp8)_g(\d+)(_perm)?", kind)
    if m is None or int(m.group(2)) % 32 or int(m.group(2)) == 0 or \
            (m.group(1) == "fp8" and m.group(3)):
        raise ValueError(f"quantized weight kind {kind!r} is not one of {sorted(FORMATS)} "
                         "or int4_g<G>[_perm] / fp8_g<G> (G a multiple of 32)")
    return m.group(1), int(m.group(2)), bool(m.group(3))


def block(kind: str) -> int:
    """The quantized axis must be a multiple of this."""
    if kind in BLOCK:
        return BLOCK[kind]
    return 1 if kind == "fp8" else parse_kind(kind)[1]


def block_kernel_kind(kind: str) -> bool:
    """Whether the C++ block kernel multiplies weights of ``kind`` (GGUF blocks, int4 groups)."""
    return kind in GGUF_KINDS.values() or kind.startswith("int4_g")


def component_shapes(kind: str, shape: tuple[int, ...], axis: int) -> dict[str, tuple]:
    """Component name -> shape for a weight of ``shape`` quantized along ``axis``."""
    axis = axis % len(shape)
    if shape[axis] % block(kind):
        raise ValueError(f"{kind}: axis {axis} of {shape} is not a multiple of {block(kind)}")
    out = {}
    for name, (_, div) in formats(kind).items():
        if div == 0:
            out[name] = shape[:axis] + shape[axis + 1:]
        elif div == -1:
            out[name] = (shape[axis],)
        else:
            out[name] = shape[:axis] + (shape[axis] // div,) + shape[axis + 1:]
    return out


def component_dtypes(kind: str) -> dict[str, np.dtype]:
    return {name: np.dtype(dt) for name, (dt, _) in formats(kind).items()}


# ----------------------------------------------------------------------------- device side


def _nibbles(qs: jax.Array) -> jax.Array:  # u8[In/2, R] -> u8[In/32, 32, R]
    b = qs.reshape((qs.shape[0] // 16, 16) + qs.shape[1:])
    return jnp.concatenate([b & 15, b >> 4], axis=1)


def _per(x: jax.Array, n: int) -> jax.Array:  # [In/n, R] -> f32 [In/n, 1, R]
    return x.astype(jnp.float32)[:, None]


def _dequant_axis0(kind: str, c: dict, dtype) -> jax.Array:
    """Components with the quantized axis first ([In_c, R...]) -> [In, R...]."""
    f32 = jnp.float32
    if kind in ("int8", "fp8"):
        return (c["q"].astype(f32) * c["scale"].astype(f32)).astype(dtype)
    if kind.startswith(("int4_g", "fp8_g")):
        return _dequant_grouped(kind, c, dtype)
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


def gather_perm(kind: str, comps: dict, x: jax.Array) -> tuple[str, dict, jax.Array]:
    """A ``_perm`` kind's product as its plain kind's: (kind, components, x [T, In]
    with its columns in the weight's row order). Other kinds pass through."""
    if not kind.endswith("_perm"):
        return kind, comps, x
    rest = {k: v for k, v in comps.items() if k != "perm"}
    return kind[:-len("_perm")], rest, jnp.take(x, comps["perm"], axis=-1)


def _dequant_grouped(kind: str, c: dict, dtype) -> jax.Array:
    """int4_g / fp8_g components (quantized axis first, no perm) -> [In, R...]."""
    base, g, _ = parse_kind(kind)
    s = c["s"].astype(jnp.float32)[:, None]  # [In/g, 1, R]
    if base == "fp8":
        q = c["q"]
        w = q.reshape((q.shape[0] // g, g) + q.shape[1:]).astype(jnp.float32) * s
    else:
        q = _nibbles(c["qs"])  # [In/32, 32, R]
        q = q.reshape((q.shape[0] * 32 // g, g) + q.shape[2:]).astype(jnp.float32)
        w = s * (q - c["z"].astype(jnp.float32)[:, None])
    return w.reshape((w.shape[0] * g,) + w.shape[2:]).astype(dtype)


def dequantize(kind: str, comps: dict, axis: int, dtype) -> jax.Array:
    """The float weight (logical shape) of ``comps`` quantized along ``axis`` (0 or -1)."""
    if kind.endswith("_perm"):  # rows stored in group order: back to the input's order
        rest = {k: v for k, v in comps.items() if k != "perm"}
        w = dequantize(kind[:-len("_perm")], rest, axis, dtype)
        return jnp.take(w, jnp.argsort(comps["perm"]), axis=axis)
    if axis == 0:
        return _dequant_axis0(kind, comps, dtype)
    moved = {k: jnp.moveaxis(v, -1, 0) if v.ndim == comps_ndim(comps) else v
             for k, v in comps.items()}
    return jnp.moveaxis(_dequant_axis0(kind, moved, dtype), 0, -1)


def comps_ndim(comps: dict) -> int:
    return max(v.ndim for v in comps.values())


# Dequantized float bytes of one chunk of a weight in :func:`chunked_matmul`: small
# enough to stay in cache and to keep the step's scratch memory small. Dequantizing a
# whole weight writes a float copy of it, and XLA:CPU gives every such copy its own
# scratch buffer (540 MB for SmolLM2 in int8), page-faulted afresh on each step:
# about 132k page faults per step, most of a quantized step's time. With 256 KiB
# chunks: 17 MB of scratch, ~2.5k faults (BENCHMARKS.md#quantized-weights).
CHUNK_BYTES = 1 << 18


# Steps with more rows than this dequantize whole weights: at 256 decode rows chunking
# made SmolLM2 steps 1.3x slower (BENCHMARKS.md#quantized-weights), at 16 and 64 rows faster.
CHUNK_MAX_ROWS = 64


def chunked(rows: int, mesh) -> bool:
    """Whether a matmul over ``rows`` rows dequantizes chunk by chunk (one device only)."""
    return mesh is None and rows <= CHUNK_MAX_ROWS


def num_chunks(n: int, block: int, row_elems: int, itemsize: int = 4) -> int:
    """Chunks along an axis of ``n`` (each a whole number of ``block``s, dividing it
    evenly) such that a chunk's ``n / chunks * row_elems`` floats fit CHUNK_BYTES."""
    blocks = n // block
    want = -(-n * row_elems * itemsize // CHUNK_BYTES)
    return next((c for c in range(min(want, blocks), blocks + 1) if blocks % c == 0), blocks)


def _product(kind: str, c: dict, x: jax.Array, matmul) -> jax.Array:
    """``x [T, In] @ w [In, *Out]`` of components ``c`` (quantized axis first; int8
    without its scale). Q4_0/Q4_1 dot the low and the high nibbles with the first and
    second halves of each 32-block of x (no interleaving), Q4_1's minimum as the block
    sums of x times m."""
    if kind in PER_CHANNEL:
        return matmul(x, c["q"].astype(x.dtype))
    if kind not in ("q4_0", "q4_1"):
        return matmul(x, _dequant_axis0(kind, c, x.dtype))
    t, n = x.shape
    qs = c["qs"].reshape((n // 32, 16) + c["qs"].shape[1:])
    d = c["d"].astype(x.dtype)[:, None]
    half = (n // 2,) + c["qs"].shape[1:]
    lo, hi = qs & 15, qs >> 4
    if kind == "q4_0":
        lo, hi = lo.astype(jnp.int8) - 8, hi.astype(jnp.int8) - 8
    xb = x.reshape(t, n // 32, 2, 16)
    y = (matmul(xb[:, :, 0].reshape(t, n // 2), (lo.astype(x.dtype) * d).reshape(half))
         + matmul(xb[:, :, 1].reshape(t, n // 2), (hi.astype(x.dtype) * d).reshape(half)))
    if kind == "q4_1":
        y = y + matmul(xb.sum(axis=(2, 3)), c["m"].astype(x.dtype))
    return y


def chunked_matmul(kind: str, comps: dict, x: jax.Array, matmul) -> jax.Array:
    """``x [T, In] @ dequantize(comps) [In, *Out]`` dequantizing one chunk of In at a
    time inside a ``lax.scan`` (partial products summed); ``matmul(x, w)`` does the
    float dot. int8's and fp8's per-channel scale multiplies the output after the sum."""
    f32 = jnp.float32
    scale = comps.get("scale") if kind in PER_CHANNEL else None
    parts = {k: v for k, v in comps.items() if k != "scale" or kind not in PER_CHANNEL}
    n = x.shape[-1]
    out_shape = parts[next(iter(formats(kind)))].shape[1:]
    nc = num_chunks(n, block(kind), int(np.prod(out_shape)))
    if nc == 1:
        y = _product(kind, parts, x, matmul)
    else:
        split = {k: v.reshape((nc, v.shape[0] // nc) + v.shape[1:]) for k, v in parts.items()}
        xs = jnp.moveaxis(x.reshape(x.shape[0], nc, n // nc), 1, 0)  # [nc, T, In/nc]

        def body(acc, a):
            xi, ci = a
            return acc + _product(kind, ci, xi, matmul).astype(f32), None

        y, _ = jax.lax.scan(body, jnp.zeros((x.shape[0],) + out_shape, f32), (xs, split))
        y = y.astype(x.dtype)
    return y if scale is None else y * scale.astype(x.dtype)


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


def chunked_matmul_t(kind: str, comps: dict, x: jax.Array, matmul_t) -> jax.Array:
    """``x [T, H] @ dequantize(comps) [V, H].T`` (a table quantized along its last axis,
    the tied LM head) one chunk of V rows at a time inside a ``lax.scan``;
    ``matmul_t(x, w)`` is the float ``x @ w.T``. -> [T, V]."""
    v = comps[next(iter(formats(kind)))].shape[0]
    nc = num_chunks(v, 1, x.shape[-1])
    if nc == 1:
        return matmul_t(x, dequantize(kind, comps, -1, x.dtype))
    split = {k: c.reshape((nc, v // nc) + c.shape[1:]) for k, c in comps.items()}

    def body(_, ci):
        if kind == "int8":
            return None, matmul_t(x, ci["q"].astype(x.dtype)) * ci["scale"].astype(x.dtype)
        return None, matmul_t(x, dequantize(kind, ci, -1, x.dtype))

    _, ys = jax.lax.scan(body, None, split)  # [nc, T, V/nc]
    return jnp.moveaxis(ys, 0, 1).reshape(x.shape[0], v)
