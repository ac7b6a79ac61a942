"""Checkpoint tensors -> a model's state (host numpy), quantized or not.

The module's ``weight_map()`` names the HF tensors of every parameter; this
file fetches them through a :class:`pagedjax.models.loader.Checkpoint`, checks each
shape against the abstract module, and (for weights kept quantized) either
quantizes floats to int8 or carries GGUF blocks over, repacked. Device
placement (whole, or straight into shards) happens in ``models.load_model``
and ``pagedjax.distributed.sharding.load_sharded``.
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from pagedjax.models import nn
from pagedjax.models import quant as Q
from pagedjax.models.runtime import CausalLM, path_str

QUANTIZATION_CHOICES = (None, "none", "int8", "gguf", "fp8", "awq", "gptq",
                        "compressed-tensors")
CHECKPOINT_METHODS = ("fp8", "awq", "gptq", "compressed-tensors")


def _node(model: CausalLM, path: tuple):
    node = model.abstract
    for p in path:
        node = node[p] if isinstance(p, int) else getattr(node, p)
    return node


def choose_quantization(model: CausalLM, ckpt, quantization: str | None) -> dict[tuple, str]:
    """Path -> kind of every weight to keep quantized.

    None or "none": nothing (GGUF blocks are dequantized at load), except that None
    keeps a published quantized checkpoint's weights as stored. "int8": every Linear
    kernel and embedding table, per channel. "gguf": each weight stored in a
    GGUF block format we keep (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) stays in it.
    "fp8" / "awq" / "gptq" / "compressed-tensors": the checkpoint's own (its
    config.json's quantization_config must name that method).
    """
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization: {quantization!r} is not one of {QUANTIZATION_CHOICES}")
    method = getattr(ckpt, "quant_method", None)
    if quantization in CHECKPOINT_METHODS or (quantization is None and method):
        return _checkpoint_kinds(model, ckpt, quantization)
    if quantization in (None, "none"):
        return {}
    wmap = model.weight_map()
    table = nn.quantizable(model.abstract)
    if quantization == "int8":
        return {p: "int8" for p in table if path_str(p) in wmap}
    if getattr(ckpt, "qtype", None) is None:
        raise ValueError(f"quantization='gguf' needs a .gguf checkpoint, got {ckpt.source}")
    kinds = {}
    for p, (owner, attr, axis) in table.items():
        spec = wmap.get(path_str(p))
        if spec is None:
            continue
        types = {ckpt.qtype(n) for n in spec.names}
        kind = Q.GGUF_KINDS.get(types.pop()) if len(types) == 1 else None
        shape = getattr(owner, attr).shape
        if kind is not None and shape[axis] % Q.BLOCK[kind] == 0:
            kinds[p] = kind
    return kinds


def _checkpoint_kinds(model: CausalLM, ckpt, quantization: str | None) -> dict[tuple, str]:
    """The kinds of a published quantized checkpoint's Linears (models/checkpoint_quant.py)."""
    method = getattr(ckpt, "quant_method", None)
    if method is None or (quantization not in (None, method)
                          and not (quantization == "compressed-tensors" and method == "fp8")):
        raise ValueError(f"quantization={quantization!r} needs a checkpoint whose config.json "
                         f"has a {quantization} quantization_config; {ckpt.source} has "
                         f"{method or 'none'} (leave quantization unset to use it)")
    wmap = model.weight_map()
    kinds = {}
    for p, (owner, attr, axis) in nn.quantizable(model.abstract).items():
        spec = wmap.get(path_str(p))
        if spec is None or axis != 0:
            continue
        found = {ckpt.quant_kind(n) for n in spec.names}
        if found == {None}:
            continue
        if len(found) != 1:
            raise ValueError(f"{path_str(p)}: its checkpoint tensors {spec.names} are stored "
                             f"in different ways ({sorted(map(str, found))}); pagedjax fuses "
                             "them, so they must share one quantization")
        kind = found.pop()
        shape = getattr(owner, attr).shape
        if shape[0] % Q.block(kind):
            raise ValueError(f"{path_str(p)}: {shape[0]} inputs are not a multiple of "
                             f"{kind}'s group of {Q.block(kind)}")
        kinds[p] = kind
    return kinds


def _build_components(kind: str, spec, raws: list[dict], key: str) -> dict:
    """Row-layout components of each of ``spec``'s tensors -> the parameter's components,
    rearranged like its float weight (a per-output scale as [out, 1], squeezed after;
    act-order's perm, shared by the fused tensors, as it is)."""
    out = {}
    for c, (_, div) in Q.formats(kind).items():
        if c == "perm":
            perms = [r[c] for r in raws]
            if any(not np.array_equal(p, perms[0]) for p in perms[1:]):
                raise ValueError(f"{key}: the fused tensors {spec.names} have different "
                                 "act-order permutations (g_idx); pagedjax needs one")
            out[c] = perms[0]
        elif div == 0 and raws[0][c].ndim == 2:
            out[c] = np.squeeze(spec.build([r[c] for r in raws]), axis=0)
        else:
            out[c] = spec.build([r[c] for r in raws])
    return out


def iter_state(model: CausalLM, get, get_raw=None):
    """(parameter name, host numpy array) of each parameter of ``model``, one at a
    time and checked against its declared shape: a caller that places each on
    the device before asking for the next never holds the whole model on the host.

    get(hf_name) -> float numpy; get_raw(hf_name) -> (kind, components in the
    row layout) for weights ``model.quantized`` keeps in a GGUF format (they stay
    packed: no float copy is made).
    """
    wmap = model.weight_map()
    shapes = model.param_shapes()
    seen: set[str] = set()
    aliases = getattr(model.abstract, "checkpoint_aliases", None)
    if aliases:
        get = aliased(get, aliases)
    for key, spec in wmap.items():
        path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        kind = model.quantized.get(path)
        if kind is None:
            comps = {"": spec.build([get(n) for n in spec.names])}
        elif kind == "int8":
            comps = Q.quantize_int8(spec.build([get(n) for n in spec.names]),
                                    _node(model, path).axis)
        else:
            comps = _build_components(kind, spec, [get_raw(n)[1] for n in spec.names], key)
        for c, arr in comps.items():
            name = f"{key}.{c}" if c else key
            _check(model, shapes, name, arr)
            seen.add(name)
            yield name, arr
    missing = sorted(set(shapes) - seen)
    if missing:
        raise ValueError(f"{model.architecture}.weight_map: no checkpoint tensor for "
                         f"{', '.join(missing[:8])}")


def _check(model: CausalLM, shapes: dict, key: str, arr) -> None:
    if key not in shapes:
        raise ValueError(f"{model.architecture}.weight_map: {key!r} is not a parameter "
                         f"(parameters: {', '.join(sorted(shapes)[:6])}, ...)")
    if tuple(arr.shape) != tuple(shapes[key].shape):
        raise ValueError(f"{model.architecture}: checkpoint tensor for {key} has shape "
                         f"{tuple(arr.shape)}, the model declares {tuple(shapes[key].shape)}")


def placed_state(model: CausalLM, get, get_raw=None, place=None) -> dict:
    """The state of ``model`` as a nested dict, each parameter cast to its declared
    dtype and passed through ``place(name, array)`` as soon as it is read (e.g. onto
    the device; default: kept as host numpy). Memory-mapped tensors already in
    their dtype are not copied on the host."""
    shapes = model.param_shapes()
    nested = {}
    for key, arr in iter_state(model, get, get_raw):
        arr = np.asarray(arr, dtype=shapes[key].dtype)
        nested[tuple(int(p) if p.isdigit() else p for p in key.split("."))] = (
            arr if place is None else place(key, arr))
    return nnx.traversals.unflatten_mapping(nested)


def host_state(model: CausalLM, get, get_raw=None) -> dict:
    """The state of ``model`` as a nested dict of host numpy arrays, as read
    (dtypes of the checkpoint; :func:`cast_like` casts them)."""
    nested = {tuple(int(p) if p.isdigit() else p for p in key.split(".")): arr
              for key, arr in iter_state(model, get, get_raw)}
    return nnx.traversals.unflatten_mapping(nested)


def aliased(get, aliases: dict[str, tuple[str, ...]]):
    """``get`` that, for a name starting with a key of ``aliases`` and missing from the
    checkpoint, tries the same name under each alternative prefix (checkpoints saved
    by different transformers versions name the parts of a composite model differently)."""

    def lookup(name: str):
        try:
            return get(name)
        except (KeyError, ValueError):
            for prefix, alts in aliases.items():
                if name.startswith(prefix):
                    for alt in alts:
                        try:
                            return get(alt + name[len(prefix):])
                        except (KeyError, ValueError):
                            continue
            raise

    return lookup


def cast_like(host: dict, model: CausalLM):
    """Host arrays -> numpy in each parameter's declared dtype (floats in the model dtype)."""
    shapes = model.param_shapes()
    flat = nnx.traversals.flatten_mapping(host)
    out = {p: np.asarray(a, dtype=shapes[path_str(p)].dtype) for p, a in flat.items()}
    return nnx.traversals.unflatten_mapping(out)
