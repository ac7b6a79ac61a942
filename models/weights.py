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

QUANTIZATION_CHOICES = (None, "none", "int8", "gguf")


def _node(model: CausalLM, path: tuple):
    node = model.abstract
    for p in path:
        node = node[p] if isinstance(p, int) else getattr(node, p)
    return node


def choose_quantization(model: CausalLM, ckpt, quantization: str | None) -> dict[tuple, str]:
    """Path -> kind of every weight to keep quantized.

    None or "none": nothing (GGUF blocks are dequantized at load). "int8": every Linear
    kernel and embedding table, per channel. "gguf": each weight stored in a
    GGUF block format we keep (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) stays in it.
    """
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization: {quantization!r} is not one of {QUANTIZATION_CHOICES}")
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
            raws = [get_raw(n) for n in spec.names]
            comps = {c: spec.build([r[1][c] for r in raws]) for c in Q.FORMATS[kind]}
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
