"""One host->device copy per dtype instead of one per array.

A step's inputs are a pytree of a dozen or more small numpy arrays (token
ids, positions, page table, sampling parameters, ...). Copying each one is a
separate transfer with its own fixed cost, which dominates on an accelerator
where the device step itself takes a millisecond or two. :func:`pack` joins
the leaves of each dtype into one flat buffer; inside the jitted step
:func:`unpack` slices them back out (static offsets, free after compilation).
The :class:`PackSpec` is hashable and is a static argument of the step: it
depends only on the padded shapes, so it adds no compilations.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class PackSpec:
    treedef: Any  # jax.tree_util.PyTreeDef (hashable)
    dtypes: tuple[str, ...]  # one flat buffer per dtype, in this order
    leaves: tuple[tuple[int, int, tuple[int, ...]], ...]  # (buffer, offset, shape) per leaf


_signature = operator.attrgetter("dtype", "shape")


@functools.lru_cache(maxsize=512)
def _plan(treedef, signatures: tuple) -> tuple[PackSpec, tuple[tuple[int, ...], ...]]:
    """The spec and, per buffer, its leaves' indices, for leaves of these (dtype,
    shape)s: the same few shapes come back step after step, so this is worked out
    once per shape (runs per step otherwise: pack is on the host's critical path)."""
    dtypes = tuple(sorted({d.str for d, _ in signatures}))
    index = {d: i for i, d in enumerate(dtypes)}
    groups: list[list[int]] = [[] for _ in dtypes]
    sizes = [0] * len(dtypes)
    layout = []
    for k, (dtype, shape) in enumerate(signatures):
        b = index[dtype.str]
        layout.append((b, sizes[b], shape))
        groups[b].append(k)
        sizes[b] += math.prod(shape)
    return PackSpec(treedef, dtypes, tuple(layout)), tuple(tuple(g) for g in groups)


def pack(tree) -> tuple[tuple[np.ndarray, ...], PackSpec]:
    """Host side: (flat buffers, spec). Leaves must be numpy arrays or scalars."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = list(map(np.asarray, leaves))  # (C-level loops: no Python work per leaf)
    spec, groups = _plan(treedef, tuple(map(_signature, arrays)))
    pick = arrays.__getitem__
    bufs = tuple(np.concatenate(list(map(pick, g)), axis=None) for g in groups)  # (flattened)
    return bufs, spec


def unpack(bufs, spec: PackSpec):
    """Device side (traceable): the pytree back from its flat buffers."""
    leaves = []
    for b, off, shape in spec.leaves:
        n = int(np.prod(shape)) if shape else 1
        leaves.append(bufs[b][off:off + n].reshape(shape))
    return jax.tree_util.tree_unflatten(spec.treedef, leaves)
