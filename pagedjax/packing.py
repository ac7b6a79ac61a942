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
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class PackSpec:
    treedef: Any  # jax.tree_util.PyTreeDef (hashable)
    dtypes: tuple[str, ...]  # one flat buffer per dtype, in this order
    leaves: tuple[tuple[int, int, tuple[int, ...]], ...]  # (buffer, offset, shape) per leaf


def pack(tree) -> tuple[tuple[np.ndarray, ...], PackSpec]:
    """Host side: (flat buffers, spec). Leaves must be numpy arrays or scalars."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [np.asarray(x) for x in leaves]
    dtypes = tuple(sorted({a.dtype.str for a in arrays}))
    index = {d: i for i, d in enumerate(dtypes)}
    parts: list[list[np.ndarray]] = [[] for _ in dtypes]
    sizes = [0] * len(dtypes)
    layout = []
    for a in arrays:
        b = index[a.dtype.str]
        layout.append((b, sizes[b], a.shape))
        parts[b].append(a.reshape(-1))
        sizes[b] += a.size
    bufs = tuple(np.concatenate(p) if p else np.zeros(0, np.dtype(d))
                 for p, d in zip(parts, dtypes))
    return bufs, PackSpec(treedef, dtypes, tuple(layout))


def unpack(bufs, spec: PackSpec):
    """Device side (traceable): the pytree back from its flat buffers."""
    leaves = []
    for b, off, shape in spec.leaves:
        n = int(np.prod(shape)) if shape else 1
        leaves.append(bufs[b][off:off + n].reshape(shape))
    return jax.tree_util.tree_unflatten(spec.treedef, leaves)
