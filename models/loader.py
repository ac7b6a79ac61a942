"""Checkpoint readers: HF safetensors folders and GGUF files -> HF-named numpy tensors.

Both readers expose the same thing, a :class:`Checkpoint`: an HF-style config
dict plus ``get(hf_name) -> np.ndarray`` in PyTorch layouts. ``pagedjax.models.weights``
then packs those into a model's parameter tree, so one mapping per architecture
serves both formats. No torch anywhere.

* Safetensors are memory-mapped and parsed here (8-byte header length, JSON
  header, raw little-endian data); ``bfloat16`` and ``float8`` come from
  ``ml_dtypes``. Single files and sharded ``model.safetensors.index.json``.
* GGUF headers are read by ``gguf_file.GGUFFile``; tensors are dequantized
  on demand (``gguf_dequant.dequantize``: Q4_0, Q4_1 and Q8_0 in whole-tensor
  numpy passes, the other types by ``gguf.quants.dequantize``);
  llama.cpp's rotary permutation of Llama q/k weights is undone; the config is
  rebuilt from the GGUF metadata.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from typing import Callable

import ml_dtypes
import numpy as np

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}

# GGML types gguf.quants.dequantize handles in numpy and that we accept.
SUPPORTED_GGUF_TYPES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)


@dataclasses.dataclass
class Checkpoint:
    """An HF-style config and HF-named tensors (numpy, PyTorch layouts)."""

    config: dict
    get: Callable[[str], np.ndarray]
    names: Callable[[], list[str]]
    source: str
    # GGUF only: the GGML type name of a tensor ("Q4_1"), and its blocks repacked
    # for keeping quantized: (kind, components in the row layout), see models/quant.py
    qtype: Callable[[str], str] | None = None
    get_raw: Callable[[str], tuple[str, dict]] | None = None
    # A published quantized checkpoint (FP8, AWQ, GPTQ; models/checkpoint_quant.py):
    # its method, and the kind a float weight name is stored in (None: float)
    quant_method: str | None = None
    quant_kind: Callable[[str], str | None] | None = None


# ----------------------------------------------------------------------------- safetensors


def _read_safetensors_header(path: str) -> tuple[dict, int]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return header, 8 + n


class _SafetensorsFile:
    def __init__(self, path: str):
        self.path = path
        self.header, self.offset = _read_safetensors_header(path)
        self.header.pop("__metadata__", None)
        self._mm = None

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        start, end = info["data_offsets"]
        raw = self._mm[self.offset + start: self.offset + end]
        return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def read_safetensors_folder(folder: str) -> dict[str, _SafetensorsFile]:
    """Tensor name -> the file holding it (single file or sharded index)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = {fn: _SafetensorsFile(os.path.join(folder, fn)) for fn in set(weight_map.values())}
        return {name: files[fn] for name, fn in weight_map.items()}
    paths = sorted(p for p in os.listdir(folder) if p.endswith(".safetensors"))
    if not paths:
        raise FileNotFoundError(
            f"{folder}: no *.safetensors weights (and no model.safetensors.index.json); "
            "pagedjax reads HF folders with safetensors weights or .gguf files"
        )
    out = {}
    for p in paths:
        sf = _SafetensorsFile(os.path.join(folder, p))
        out.update({name: sf for name in sf.header})
    return out


def _prefixed_lookup(table: dict, name: str):
    """HF checkpoints differ in the base-model prefix (``transformer.h.0`` vs ``h.0``)."""
    if name in table:
        return name
    head, _, rest = name.partition(".")
    if head in ("model", "transformer") and rest in table:
        return rest
    for prefix in ("model.", "transformer."):
        if prefix + name in table:
            return prefix + name
    return None


def load_hf_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{folder}: no config.json (expected an HF model folder)")
    with open(path) as f:
        config = json.load(f)
    gen = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen):
        with open(gen) as f:
            g = json.load(f)
        eos = _as_list(config.get("eos_token_id")) + _as_list(g.get("eos_token_id"))
        if eos:
            config["eos_token_id"] = list(dict.fromkeys(eos))
    return config


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(x)] if isinstance(x, int) else [int(v) for v in x]


def open_hf_folder(folder: str, config: dict | None = None) -> Checkpoint:
    config = config if config is not None else load_hf_config(folder)
    table = read_safetensors_folder(folder)

    def get(name: str) -> np.ndarray:
        key = _prefixed_lookup(table, name)
        if key is None:
            raise ValueError(
                f"{folder}: tensor {name!r} not found in the safetensors checkpoint "
                f"({len(table)} tensors, e.g. {sorted(table)[:3]})"
            )
        return table[key].get(key)

    from pagedjax.models import checkpoint_quant

    sch = checkpoint_quant.scheme(config)
    if sch is None:
        return Checkpoint(config=config, get=get, names=lambda: list(table), source=folder)

    def has(name: str) -> bool:
        return _prefixed_lookup(table, name) is not None

    tensors = checkpoint_quant.QuantizedTensors(sch, get, has)

    def get_float(name: str) -> np.ndarray:  # quantized Linears dequantized (kept float)
        return tensors.dequantized(name) if tensors.kind(name) else get(name)

    return Checkpoint(config=config, get=get_float, names=lambda: list(table), source=folder,
                      get_raw=tensors.components, quant_method=sch.method,
                      quant_kind=tensors.kind)


# ----------------------------------------------------------------------------- GGUF

_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "gemma3": "Gemma3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}

# HF layer-suffix -> GGUF name, for the Llama-style architectures.
_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# Gemma 3's sandwich norms and q/k norms (llama.cpp names).
_GGUF_GEMMA3_NAMES = {
    **_GGUF_LAYER_NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
# Qwen3-MoE: q/k norms and the router; the experts are stacked tensors (see _EXPERT_RE).
_GGUF_QWEN3MOE_NAMES = {
    **_GGUF_LAYER_NAMES,
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp",
}
_GGUF_ARCH_NAMES = {"gemma3": _GGUF_GEMMA3_NAMES, "qwen3moe": _GGUF_QWEN3MOE_NAMES}
# model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight: expert e of blk.{i}.ffn_*_exps
_EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_GGUF_TOP_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}


def _field(reader, key, default=None):
    return reader.metadata.get(key, default)


def hf_to_gguf_name(name: str, arch: str = "llama") -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``."""
    layer_names = _GGUF_ARCH_NAMES.get(arch, _GGUF_LAYER_NAMES)
    expert = _EXPERT_RE.fullmatch(name)
    if expert:
        return f"blk.{expert[1]}.ffn_{expert[3]}_exps.weight"
    base, _, kind = name.rpartition(".")
    if base in _GGUF_TOP_NAMES:
        return f"{_GGUF_TOP_NAMES[base]}.{kind}"
    parts = base.split(".")
    if len(parts) >= 4 and parts[0] == "model" and parts[1] == "layers":
        suffix = ".".join(parts[3:])
        if suffix in layer_names:
            return f"blk.{parts[2]}.{layer_names[suffix]}.{kind}"
    return name


def _unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert-time permutation of q/k rows (interleaved -> halves)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, mtime_ns: int, size: int):
    from pagedjax.models.gguf_file import GGUFFile

    return GGUFFile(path)


def gguf_reader(path: str):
    """The (cached) header of a GGUF file (``gguf_file.GGUFFile``): resolving a
    model and then loading it parse it once."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: GGUF file not found")
    st = os.stat(path)
    return _cached_reader(os.path.abspath(path), st.st_mtime_ns, st.st_size)


def gguf_config(reader, path: str) -> dict:
    """An HF-style config dict from GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {sorted(_GGUF_ARCHS)})"
        )

    def req(key):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise ValueError(f"{path}: GGUF metadata field {arch}.{key} is missing")
        return v

    names = {t.name for t in reader.tensors}
    heads = int(req("attention.head_count"))
    hidden = int(req("embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    config = {
        "architectures": [_GGUF_ARCHS[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(req("feed_forward_length")),
        "num_hidden_layers": int(req("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(req("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 2048)),
        "vocab_size": int(_field(reader, f"{arch}.vocab_size", len(tokens))),
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "attention_bias": "blk.0.attn_q.bias" in names,
    }
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear",
                                  "factor": float(req("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise ValueError(f"{path}: GGUF {arch}.rope.scaling.type={scaling!r} is not supported "
                         "(supported: none, linear)")
    if arch == "gemma3":
        _gemma3_config(reader, config)
    if arch == "qwen3moe":
        config.update(  # llama.cpp renormalises the top-k weights of qwen3moe
            num_experts=int(req("expert_count")), num_experts_per_tok=int(req("expert_used_count")),
            moe_intermediate_size=int(req("expert_feed_forward_length")), norm_topk_prob=True)
        config.pop("attention_bias", None)
    for key, field in (("bos_token_id", "bos_token_id"), ("pad_token_id", "padding_token_id")):
        v = _field(reader, f"tokenizer.ggml.{field}")
        if v is not None:
            config[key] = int(v)
    eos = [_field(reader, f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id")]
    config["eos_token_id"] = list(dict.fromkeys(int(e) for e in eos if e is not None))
    return config


def _gemma3_config(reader, config: dict) -> None:
    """Gemma 3 fields llama.cpp does not store use its fixed values: local rotary
    base 10000, every 6th layer global, attention scale 1/sqrt(head_dim)."""
    n = config["num_hidden_layers"]
    pattern = _field(reader, "gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per-layer booleans: True = sliding
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention"
                 for i in range(n)]
    config.update(
        hidden_activation="gelu_pytorch_tanh",
        rope_local_base_freq=10000.0,
        sliding_window=int(_field(reader, "gemma3.attention.sliding_window", 512)),
        layer_types=types,
        query_pre_attn_scalar=config["head_dim"],
        final_logit_softcapping=_field(reader, "gemma3.final_logit_softcapping"),
        attn_logit_softcapping=_field(reader, "gemma3.attn_logit_softcapping"),
    )
    config.pop("hidden_act", None)
    config.pop("attention_bias", None)


def open_gguf(path: str) -> Checkpoint:
    import gguf

    from pagedjax.models import gguf_dequant

    reader = gguf_reader(path)
    config = gguf_config(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    arch = config["model_type"]
    permute = arch == "llama"

    def tensor(name: str):
        gname = hf_to_gguf_name(name, arch)
        t = tensors.get(gname)
        if t is None:
            raise ValueError(f"{path}: tensor {gname!r} (for {name!r}) not found in the GGUF file")
        return t

    def qtype(name: str) -> str:
        return gguf.GGMLQuantizationType(tensor(name).tensor_type).name

    def unpermute(name: str, w: np.ndarray) -> np.ndarray:
        if permute and name.endswith(("q_proj.weight", "k_proj.weight")):
            n = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
            return _unpermute_rotary(w, n)
        return w

    def get_raw(name: str) -> tuple[str, dict]:
        from pagedjax.models import quant

        t = tensor(name)
        kind = quant.GGUF_KINDS[qtype(name)]
        shape = tuple(int(n) for n in reversed(t.shape))  # [rows, n]
        raw = np.asarray(t.data).reshape(shape[0], -1)
        comps = quant.repack_gguf(kind, raw, shape[-1])
        return kind, {c: unpermute(name, a) for c, a in comps.items()}

    @functools.lru_cache(maxsize=3)  # a layer's gate, up and down stacks, while read
    def stacked(gname: str) -> np.ndarray:
        t = tensors[gname]
        w = gguf_dequant.dequantize(t.data, t.tensor_type)
        return np.asarray(w, np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))

    def get(name: str) -> np.ndarray:
        t = tensor(name)
        gname = t.name
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        if qtype.name not in SUPPORTED_GGUF_TYPES:
            raise ValueError(
                f"{path}: tensor {gname!r} has GGML type {qtype.name}, which pagedjax cannot "
                f"dequantize (supported: {', '.join(SUPPORTED_GGUF_TYPES)})"
            )
        expert = _EXPERT_RE.fullmatch(name)
        if expert:  # one expert of a stacked [E, rows, n] tensor (dequantized once)
            return stacked(gname)[int(expert[2])]
        w = gguf_dequant.dequantize(t.data, qtype)
        w = unpermute(name, w.reshape(tuple(int(n) for n in reversed(t.shape))))
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's (1 + w) norm scales with the 1 added
        return w

    return Checkpoint(config=config, get=get, names=lambda: list(tensors), source=path,
                      qtype=qtype, get_raw=get_raw)
