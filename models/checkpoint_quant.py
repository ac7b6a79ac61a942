"""Published quantized safetensors checkpoints (FP8, AWQ, GPTQ) read as they are.

``config.json``'s ``quantization_config`` names the method; :func:`scheme`
reads it (ValueError naming what is supported for anything else) and
:class:`QuantizedTensors` turns a Linear's stored tensors into
models/quant.py's components in the row layout ``[out, in_c]`` (the loader
rearranges them like the float weight), or into the float weight itself
(``quantization="none"``, layers kept float). Supported:

    fp8    compressed-tensors "float-quantized" (weight f8e4m3 [out, in],
           weight_scale per tensor [] / [1] or per channel [out, 1]) and the
           "fp8" method (weight_scale per tensor, or weight_scale_inv
           [ceil(out/bo), ceil(in/bi)] with weight_block_size [bo, bi]):
           kinds fp8 (one f32 scale per output, per-tensor scales repeated)
           and fp8_g<bi> (the block scales repeated over their bo outputs).
           Weight-only: activations stay float (input_scale is not used).
    awq    4 bits, GEMM packing, zero points: qweight i32 [in, out/8] (nibble
           i of a word holds column AWQ_ORDER[i]), qzeros i32 [in/G, out/8]
           (same order), scales [in/G, out]; w = (q - z) * s.
    gptq   4 bits, qweight i32 [in/8, out] (nibble i: row 8r + i), qzeros
           i32 [groups, out/8], scales [groups, out], g_idx [in]; sym or asym;
           checkpoint_format "gptq" stores each zero minus one (read back +1),
           "gptq_v2" as is; act-order (g_idx not i // G): the rows are
           permuted into group order at load and the kind's perm gathers x.

int4 groups become kind ``int4_g<G>`` (``_perm`` with act-order): the codes
repacked into Q4_0's nibble order, s f32 and z u8 per group, the values
``s * (q - z)`` exactly as stored (4.3 bits a weight at G = 128).
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

SUPPORTED = ("fp8 (compressed-tensors float-quantized 8-bit e4m3 weights, per tensor, "
             "channel or block; or quant_method fp8), awq (4 bits, version gemm, "
             "zero_point), gptq (4 bits, checkpoint_format gptq or gptq_v2, with or "
             "without desc_act)")
METHODS = ("fp8", "awq", "gptq", "compressed-tensors")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a qweight word holds column AWQ_ORDER[i]


@dataclasses.dataclass(frozen=True)
class Scheme:
    method: str  # "fp8" | "awq" | "gptq"
    group: int = 0  # int4: rows per group (-1: one group per column); fp8: block along in
    out_block: int = 0  # fp8 blocks: outputs per block
    gptq_v1_zeros: bool = False  # gptq: zeros stored minus one


def _unsupported(what: str) -> ValueError:
    return ValueError(f"quantization_config: {what} is not supported; pagedjax reads {SUPPORTED}")


def scheme(config: dict) -> Scheme | None:
    """The checkpoint's quantization (None for a float checkpoint); ValueError for a
    variant pagedjax does not read, naming the supported ones."""
    qc = config.get("quantization_config") or config.get("compression_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block is not None and (len(block) != 2 or min(block) <= 0 or block[1] % 32):
            raise _unsupported(f"fp8 weight_block_size={block} (need [out, in], in a "
                               "multiple of 32)")
        return Scheme("fp8", int(block[1]) if block else 0, int(block[0]) if block else 0)
    if method in ("awq", "gptq"):
        return _int4(method, qc)
    raise _unsupported(f"quant_method={method!r}")


def _int4(method: str, qc: dict) -> Scheme:
    bits = qc.get("bits", qc.get("w_bit"))
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    if bits != 4:
        raise _unsupported(f"{method} with bits={bits}")
    if group != -1 and (group <= 0 or group % 32):
        raise _unsupported(f"{method} group_size={group} (need a multiple of 32, or -1)")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise _unsupported(f"awq version={version!r} (only the GEMM packing)")
        if not qc.get("zero_point", True):
            raise _unsupported("awq zero_point=false")
        return Scheme("awq", group)
    fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _unsupported(f"gptq checkpoint_format={fmt!r}")
    return Scheme("gptq", group, gptq_v1_zeros=fmt == "gptq")


def _compressed_tensors(qc: dict) -> Scheme:
    fmt = qc.get("format")
    groups = list((qc.get("config_groups") or {}).values())
    if fmt != "float-quantized" or not groups:
        raise _unsupported(f"compressed-tensors format={fmt!r}")
    strategies = set()
    for g in groups:
        w = g.get("weights") or {}
        if w.get("type") != "float" or w.get("num_bits") != 8:
            raise _unsupported(f"compressed-tensors weights {w.get('type')} "
                               f"{w.get('num_bits')} bits")
        strategies.add((w.get("strategy"), tuple(w.get("block_structure") or ())))
    if len(strategies) != 1:
        raise _unsupported("compressed-tensors groups with different strategies")
    strategy, block = strategies.pop()
    if strategy in ("tensor", "channel"):
        return Scheme("fp8")
    if strategy == "block" and len(block) == 2 and block[1] % 32 == 0:
        return Scheme("fp8", int(block[1]), int(block[0]))
    raise _unsupported(f"compressed-tensors fp8 strategy={strategy!r} {list(block)}")


# ----------------------------------------------------------------------------- unpacking


def unpack_cols(packed: np.ndarray, order=tuple(range(8))) -> np.ndarray:
    """i32 [r, c/8] -> u8 [r, c]: nibble i of word j is column 8j + order[i]."""
    words = np.ascontiguousarray(packed).view(np.uint32)
    nib = np.stack([(words >> (4 * i)) & 15 for i in range(8)], axis=-1)  # [r, c/8, 8]
    out = np.empty_like(nib)
    out[..., list(order)] = nib
    return out.reshape(packed.shape[0], -1).astype(np.uint8)


def unpack_rows(packed: np.ndarray) -> np.ndarray:
    """i32 [r/8, c] -> u8 [r, c]: nibble i of word (j, col) is row 8j + i."""
    words = np.ascontiguousarray(packed).view(np.uint32)
    nib = np.stack([(words >> (4 * i)) & 15 for i in range(8)], axis=1)  # [r/8, 8, c]
    return nib.reshape(-1, packed.shape[1]).astype(np.uint8)


def pack_q4(q: np.ndarray) -> np.ndarray:
    """u8 codes [out, in] -> qs u8 [out, in/2] in Q4_0's order (byte j of a 32-block:
    elements j and j + 16)."""
    b = q.reshape(q.shape[0], -1, 2, 16)
    return (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(q.shape[0], -1)


def int4_components(q: np.ndarray, s: np.ndarray, z: np.ndarray, g_idx: np.ndarray,
                    name: str) -> tuple[str, dict]:
    """Codes q [in, out], scales s and zeros z [groups, out], each row's group
    g_idx [in] -> (kind, row-layout components). Rows are put in group order when
    g_idx is not already (act-order); every group must hold the same number of rows."""
    n_in = q.shape[0]
    counts = np.bincount(g_idx, minlength=s.shape[0])
    g = int(counts[0])
    if np.any(counts != g) or g % 32:
        raise ValueError(f"{name}: g_idx gives groups of {sorted(set(counts.tolist()))} rows; "
                         "pagedjax needs equal groups of a multiple of 32 rows")
    perm = np.argsort(g_idx, kind="stable").astype(np.int32)
    identity = bool(np.all(perm == np.arange(n_in)))
    if not identity:
        q = q[perm]
    comps = {"qs": pack_q4(np.ascontiguousarray(q.T)),
             "s": np.ascontiguousarray(s.T.astype(np.float32)),
             "z": np.ascontiguousarray(z.T.astype(np.uint8))}
    if identity:
        return f"int4_g{g}", comps
    return f"int4_g{g}_perm", {**comps, "perm": perm}


def fp8_components(q: np.ndarray, scale: np.ndarray, sch: Scheme, name: str) -> tuple[str, dict]:
    """f8e4m3 weight [out, in] and its scale -> (kind, row-layout components)."""
    out, n_in = q.shape
    scale = np.asarray(scale, np.float32)
    if sch.group == 0:  # per tensor or per channel: one scale per output (as [out, 1])
        if scale.size not in (1, out):
            raise ValueError(f"{name}: weight_scale of shape {scale.shape} is neither per "
                             f"tensor nor per output channel ({out})")
        return "fp8", {"q": q, "scale": np.broadcast_to(scale.reshape(-1, 1), (out, 1)).copy()}
    bo, bi = sch.out_block, sch.group
    want = (-(-out // bo), -(-n_in // bi))
    if scale.shape != want or n_in % bi:
        raise ValueError(f"{name}: block scales of shape {scale.shape} for a [{out}, {n_in}] "
                         f"weight in blocks of [{bo}, {bi}] (need {want}, in a multiple of {bi})")
    return f"fp8_g{bi}", {"q": q, "s": np.repeat(scale, bo, axis=0)[:out].copy()}


class QuantizedTensors:
    """One checkpoint's quantized Linears: ``kind(name)``, ``components(name)`` and
    ``dequantized(name)`` for a float weight name (``...q_proj.weight``);
    ``get(name)`` reads a stored tensor (the checkpoint's own getter)."""

    def __init__(self, sch: Scheme, get, has):
        self.scheme, self.get, self.has = sch, get, has

    def kind(self, name: str) -> str | None:
        """The kind ``name`` is stored in (None: a float tensor), from shapes and g_idx."""
        base, sch = name.removesuffix(".weight"), self.scheme
        if sch.method == "fp8":
            if not self.has(name) or self.get(name).dtype != ml_dtypes.float8_e4m3fn:
                return None
            return f"fp8_g{sch.group}" if sch.group else "fp8"
        if not self.has(base + ".qweight"):
            return None
        qweight, scales = self.get(base + ".qweight"), self.get(base + ".scales")
        n_in = qweight.shape[0] * (8 if sch.method == "gptq" else 1)
        g = n_in // max(1, scales.shape[0])
        perm = False
        if sch.method == "gptq" and self.has(base + ".g_idx"):
            g_idx = np.asarray(self.get(base + ".g_idx"), np.int64)
            perm = not np.array_equal(g_idx, np.arange(n_in) // g)
        return f"int4_g{g}_perm" if perm else f"int4_g{g}"

    def components(self, name: str) -> tuple[str, dict]:
        base, sch = name.removesuffix(".weight"), self.scheme
        if sch.method == "fp8":
            scale_name = base + (".weight_scale_inv" if self.has(base + ".weight_scale_inv")
                                 else ".weight_scale")
            return fp8_components(self.get(name), self.get(scale_name), sch, name)
        qweight, scales = self.get(base + ".qweight"), self.get(base + ".scales")
        if sch.method == "awq":
            q = unpack_cols(qweight, AWQ_ORDER)  # [in, out]
            z = unpack_cols(self.get(base + ".qzeros"), AWQ_ORDER)
            g_idx = np.arange(q.shape[0]) // (q.shape[0] // scales.shape[0])
        else:
            q = unpack_rows(qweight)
            z = unpack_cols(self.get(base + ".qzeros")) + (1 if sch.gptq_v1_zeros else 0)
            g_idx = (np.asarray(self.get(base + ".g_idx"), np.int64) if self.has(base + ".g_idx")
                     else np.arange(q.shape[0]) // (q.shape[0] // scales.shape[0]))
        if q.shape[1] != scales.shape[1] or z.shape != scales.shape:
            raise ValueError(f"{base}: qweight {qweight.shape}, qzeros and scales "
                             f"{scales.shape} do not describe one {sch.method} weight")
        return int4_components(q, np.asarray(scales, np.float32), z, g_idx, base)

    def dequantized(self, name: str) -> np.ndarray:
        """The float32 weight [out, in] (HF layout) of a quantized Linear."""
        kind, c = self.components(name)
        if kind.startswith("fp8"):
            q = c["q"].astype(np.float32)
            s = c["scale"] if kind == "fp8" else np.repeat(c["s"], q.shape[1] // c["s"].shape[1], 1)
            return q * s
        qs = c["qs"].reshape(c["qs"].shape[0], -1, 16)
        nib = np.stack([qs & 15, qs >> 4], axis=-2).reshape(qs.shape[0], -1)
        g = nib.shape[1] // c["s"].shape[1]
        w = np.repeat(c["s"], g, 1) * (nib.astype(np.float32) - np.repeat(c["z"], g, 1))
        if "perm" in c:
            w = w[:, np.argsort(c["perm"])]
        return w
