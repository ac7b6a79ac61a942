"""The LoRA slot tables in the engine's parameters: created empty, one slot written at a time.

The tables are parameters of the model (``models/lora.py``: ``...<proj>.lora.a``
[N, In, R] and ``.b`` [N, R, *Out]; with ``scan_layers`` a leading layer axis).
:class:`SlotWriter` replaces one slot of every table with one compiled program
whose inputs are the tables (donated: updated in place), the slot index (traced)
and the new values, so loading any adapter into any slot never recompiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _is_lora(key: tuple) -> bool:
    return len(key) >= 2 and key[-2] == "lora"


def init_tables(model, params: dict, mesh=None) -> dict:
    """``params`` plus zero slot tables for ``model`` (a CausalLM built with a LoRASpec),
    sharded by their logical axes under tensor parallelism."""
    flat = dict(nnx.traversals.flatten_mapping(params))
    shapes = model.param_shapes()
    specs = None
    if mesh is not None:
        from pagedjax.distributed.sharding import param_specs

        specs = nnx.traversals.flatten_mapping(
            param_specs(model, mesh.devices.size),
            is_leaf=lambda _, x: isinstance(x, jax.sharding.PartitionSpec))
    for dotted, sds in shapes.items():
        key = tuple(int(p) if p.isdigit() else p for p in dotted.split("."))
        if not _is_lora(key):
            continue
        if specs is None:
            flat[key] = jnp.zeros(sds.shape, sds.dtype)
        else:
            sh = jax.sharding.NamedSharding(mesh, specs[key])
            flat[key] = jax.jit(lambda s=sds: jnp.zeros(s.shape, s.dtype), out_shardings=sh)()
    return nnx.traversals.unflatten_mapping(flat)


def _write(leaves, slot, values, *, stacked: bool):
    if stacked:
        return tuple(t.at[:, slot].set(v.astype(t.dtype)) for t, v in zip(leaves, values))
    return tuple(t.at[slot].set(v.astype(t.dtype)) for t, v in zip(leaves, values))


class SlotWriter:
    """Writes one adapter's values into one slot of every table of a params dict."""

    def __init__(self):
        self._fn = None
        self._keys: list[tuple] | None = None

    def write(self, params: dict, slot: int, values: dict[tuple, tuple]) -> dict:
        """values: target module path -> (a [In, R], b [R, *Out]); returns the new params."""
        flat = dict(nnx.traversals.flatten_mapping(params))
        if self._keys is None:
            self._keys = sorted((k for k in flat if _is_lora(k)), key=str)
        keys = self._keys
        stacked = bool(keys) and not isinstance(keys[0][1], int)
        vals = []
        for k in keys:
            owner, which = k[:-2], 0 if k[-1] == "a" else 1
            if stacked:  # ("layers", <rest>) -> values of ("layers", i, <rest>) stacked
                n = flat[k].shape[0]
                vals.append(np.stack([values[(owner[0], i) + owner[1:]][which]
                                      for i in range(n)]))
            else:
                vals.append(values[owner][which])
        leaves = tuple(flat[k] for k in keys)
        if self._fn is None:
            self._fn = jax.jit(lambda lv, s, v: _write(lv, s, v, stacked=stacked),
                               donate_argnums=(0,),
                               out_shardings=tuple(t.sharding for t in leaves))
        new = self._fn(leaves, jnp.int32(slot), tuple(vals))
        flat.update(zip(keys, new))
        return nnx.traversals.unflatten_mapping(flat)
