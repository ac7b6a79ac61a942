"""Tiny random Llama checkpoints written in published quantized layouts, and an
independent numpy reader of those layouts (written from each format's
documentation, not from pagedjax's loader):

    AWQ (GEMM)   qweight i32 [in, out/8]: nibble i of a word is column 8j + ORDER[i],
                 ORDER = [0, 2, 4, 6, 1, 3, 5, 7]; qzeros i32 [in/G, out/8] alike;
                 scales f16 [in/G, out]; w = (q - z) * s
    GPTQ         qweight i32 [in/8, out]: nibble i of word r is row 8r + i; qzeros
                 i32 [groups, out/8] (nibble i: column 8j + i), stored z - 1 in the
                 "gptq" format, z in "gptq_v2"; scales f16 [groups, out]; g_idx
                 i32 [in]; w[i] = (q[i] - z[g_idx[i]]) * s[g_idx[i]]
    FP8          weight f8e4m3 [out, in]; compressed-tensors: weight_scale [out, 1]
                 (channel) or [1] (tensor); the fp8 method: weight_scale_inv
                 [ceil(out/bo), ceil(in/bi)]; w = q * scale
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# projections reading the same input share GPTQ's act-order permutation
SHARED_INPUT = {"self_attn.q_proj": "qkv", "self_attn.k_proj": "qkv", "self_attn.v_proj": "qkv",
                "mlp.gate_proj": "gate_up", "mlp.up_proj": "gate_up"}
F8_MAX = 448.0


def tiny_llama(seed: int = 0, vocab: int = 512):
    """A random 2-layer Llama (transformers), untied head, float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # weights of a trained model's scale: logits far apart
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(3.0)
    return model


def _pack(nibbles: np.ndarray, axis: int, order=range(8)) -> np.ndarray:
    """u8 values 0..15 -> i32, 8 along ``axis`` per word, nibble i = element order[i]."""
    x = np.moveaxis(nibbles.astype(np.uint32), axis, -1)
    x = x.reshape(x.shape[:-1] + (-1, 8))
    word = np.zeros(x.shape[:-1], np.uint32)
    for i, e in enumerate(order):
        word |= (x[..., e] & 15) << np.uint32(4 * i)
    return np.moveaxis(word.view(np.int32), -1, axis)


def _unpack(words: np.ndarray, axis: int, order=range(8)) -> np.ndarray:
    x = np.moveaxis(words.view(np.uint32), axis, -1)
    out = np.zeros(x.shape + (8,), np.int64)
    for i, e in enumerate(order):
        out[..., e] = (x >> np.uint32(4 * i)) & 15
    return np.moveaxis(out.reshape(x.shape[:-1] + (-1,)), -1, axis)


def _groups(w_t: np.ndarray, g_idx: np.ndarray, n_groups: int, sym: bool):
    """Per group (rows of w_t [in, out] with g_idx == g): f16 scale, zero, codes."""
    s = np.zeros((n_groups, w_t.shape[1]), np.float16)
    z = np.zeros((n_groups, w_t.shape[1]), np.int64)
    for g in range(n_groups):
        rows = w_t[g_idx == g]
        if sym:
            amax = np.abs(rows).max(0)
            s[g], z[g] = (2 * amax / 15).astype(np.float16), 8
        else:
            lo, hi = np.minimum(rows.min(0), 0), np.maximum(rows.max(0), 0)
            s[g] = ((hi - lo) / 15).astype(np.float16)
            z[g] = np.clip(np.rint(-lo / s[g].astype(np.float32)), 0, 15)
    s = np.where(s == 0, np.float16(1e-3), s)
    q = np.clip(np.rint(w_t / s[g_idx].astype(np.float32)) + z[g_idx], 0, 15).astype(np.int64)
    return s, z, q


def write_awq(w: np.ndarray, group: int) -> dict:
    w_t = w.T  # [in, out]
    g_idx = np.arange(w_t.shape[0]) // group
    s, z, q = _groups(w_t, g_idx, w_t.shape[0] // group, sym=False)
    return {"qweight": _pack(q, 1, AWQ_ORDER), "qzeros": _pack(z, 1, AWQ_ORDER), "scales": s}


def write_gptq(w: np.ndarray, group: int, sym: bool, v1: bool, perm=None) -> dict:
    w_t = w.T
    n_in = w_t.shape[0]
    group = n_in if group == -1 else group
    g_idx = np.arange(n_in) // group
    if perm is not None:  # act-order: row perm[j] belongs to group j // G
        g_idx = np.empty(n_in, np.int64)
        g_idx[perm] = np.arange(n_in) // group
    s, z, q = _groups(w_t, g_idx, n_in // group, sym)
    stored = (z - 1) & 15 if v1 else z
    return {"qweight": _pack(q, 0), "qzeros": _pack(stored, 1), "scales": s,
            "g_idx": g_idx.astype(np.int32)}


def write_fp8(w: np.ndarray, strategy: str, block=(32, 32)) -> dict:
    out, n_in = w.shape
    if strategy == "tensor":
        scale = np.array([np.abs(w).max() / F8_MAX], np.float32)
        return {"weight": (w / scale).astype(ml_dtypes.float8_e4m3fn), "weight_scale": scale}
    if strategy == "channel":
        scale = (np.abs(w).max(1, keepdims=True) / F8_MAX).astype(np.float32)
        return {"weight": (w / scale).astype(ml_dtypes.float8_e4m3fn), "weight_scale": scale}
    bo, bi = block
    blocks = np.abs(w).reshape(out // bo, bo, n_in // bi, bi).max((1, 3))
    scale = (blocks / F8_MAX).astype(np.float32)
    full = np.repeat(np.repeat(scale, bo, 0), bi, 1)
    return {"weight": (w / full).astype(ml_dtypes.float8_e4m3fn), "weight_scale_inv": scale}


def config_for(fmt: str, **kw) -> dict:
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": kw["group"], "zero_point": True,
                "version": "gemm"}
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": kw["group"],
                "desc_act": kw.get("desc_act", False), "sym": kw["sym"],
                "checkpoint_format": "gptq" if kw["v1"] else "gptq_v2"}
    if fmt == "fp8_block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic",
                "weight_block_size": list(kw.get("block", (32, 32)))}
    group = {"targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "strategy": kw["strategy"],
                         "symmetric": True, "dynamic": False}}
    if not kw.get("weight_only"):  # FP8_DYNAMIC: activations quantized per token as well
        group["input_activations"] = {"num_bits": 8, "type": "float", "strategy": "token",
                                      "dynamic": True, "symmetric": True}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": group}}


def save_quantized(model, folder: str, fmt: str, seed: int = 0, **kw) -> dict:
    """Write ``model``'s Linears of every layer in ``fmt`` ("awq", "gptq", "fp8_block",
    "fp8_ct"), the rest float32, with config.json; returns the config."""
    rng = np.random.default_rng(seed)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    out, perms = {}, {}
    for name, w in sd.items():
        base = name.removesuffix(".weight")
        proj = next((p for p in PROJ if base.endswith(p)), None)
        if proj is None:
            out[name] = w
            continue
        if fmt == "awq":
            tensors = write_awq(w, kw["group"])
        elif fmt == "gptq":
            perm = None
            if kw.get("desc_act"):
                key = (base.rsplit(".", 2)[0], SHARED_INPUT.get(proj, proj))
                perm = perms.setdefault(key, rng.permutation(w.shape[1]))
            tensors = write_gptq(w, kw["group"], kw["sym"], kw["v1"], perm)
        else:
            tensors = write_fp8(w, kw.get("strategy", "block"), kw.get("block", (32, 32)))
        out.update({f"{base}.{k}": v for k, v in tensors.items()})
    save_safetensors(out, os.path.join(folder, "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = config_for(fmt, **kw)
    config["torch_dtype"] = "float32"
    config["architectures"] = ["LlamaForCausalLM"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return config


ST_DTYPES = {"float32": "F32", "float16": "F16", "int32": "I32", "int64": "I64",
             "float8_e4m3fn": "F8_E4M3"}


def save_safetensors(tensors: dict, path: str) -> None:
    """The safetensors layout (8-byte header length, JSON header, raw little-endian
    data), written here: safetensors' numpy writer has no float8."""
    header, offset, blobs = {}, 0, []
    for name, v in sorted(tensors.items()):
        b = np.ascontiguousarray(v).tobytes()
        header[name] = {"dtype": ST_DTYPES[str(v.dtype)], "shape": list(v.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


def load_safetensors(path: str) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header, data = json.loads(f.read(n)), f.read()
    names = {v: k for k, v in ST_DTYPES.items()}
    return {k: np.frombuffer(data[i["data_offsets"][0]:i["data_offsets"][1]],
                             np.dtype(names[i["dtype"]])).reshape(i["shape"])
            for k, i in header.items()}


def dequantize_folder(folder: str) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as float32, quantized Linears dequantized here
    (HF names, [out, in])."""
    with open(os.path.join(folder, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    t = load_safetensors(os.path.join(folder, "model.safetensors"))
    out = {}
    for name, v in t.items():
        base, _, leaf = name.rpartition(".")
        if leaf == "qweight":
            out[base + ".weight"] = _int4(qc, {k: t[f"{base}.{k}"] for k in
                                               ("qweight", "qzeros", "scales", "g_idx")
                                               if f"{base}.{k}" in t})
        elif leaf == "weight" and v.dtype == ml_dtypes.float8_e4m3fn:
            scale = t.get(base + ".weight_scale", t.get(base + ".weight_scale_inv"))
            q = v.astype(np.float32)
            if scale.size > 1 and scale.shape[1] > 1:  # blocks
                bo, bi = qc["weight_block_size"]
                scale = np.repeat(np.repeat(scale, bo, 0), bi, 1)[:q.shape[0], :q.shape[1]]
            out[name] = q * scale.reshape(-1, 1) if scale.ndim < 2 or scale.shape[1] == 1 \
                else q * scale
        elif leaf in ("weight", "bias") or name.endswith("norm.weight"):
            out[name] = v.astype(np.float32)
    return out


def _int4(qc: dict, t: dict) -> np.ndarray:
    s = t["scales"].astype(np.float32)
    if qc["quant_method"] == "awq":
        q = _unpack(t["qweight"], 1, AWQ_ORDER)  # [in, out]
        z = _unpack(t["qzeros"], 1, AWQ_ORDER)
        g_idx = np.arange(q.shape[0]) // qc["group_size"]
    else:
        q = _unpack(t["qweight"], 0)
        z = _unpack(t["qzeros"], 1) + (1 if qc.get("checkpoint_format") == "gptq" else 0)
        g_idx = t["g_idx"].astype(np.int64)
    return ((q - z[g_idx]) * s[g_idx]).T.astype(np.float32)
