"""The step program's weights as few arguments: many of them packed in one buffer.

jit's dispatch costs host time for every argument at every call, and on the CPU
that time is taken from the cores the step's kernels run on: the default model's
423 weights cost about 0.4 ms of host CPU a step once the kernels have swept the
caches (benchmarks/features/single_stream.py prints the host's CPU a token). On
the CPU with one device, the runner therefore packs into one 64-byte aligned
``uint8`` buffer:

* the components of the Linear layers' GGUF-block and int4 weights, where every
  step runs them in the C++ block kernel (the kernel reads them in the buffer, in
  place: kernels_pallas/packed.py);
* every small 1-D weight (norm scales, biases), which elementwise ops read
  through their views, fused.

The buffer and each packed weight are zero-copy arrays over the same host memory
(``jax.device_put(..., may_alias=True)``), so the runner's ``params`` still hold
an array per weight and the weights take no extra memory; the engine hands its
loaded weights over, and each is freed as soon as it is copied. The step program
takes ``args`` (the buffer, then the other weights) and rebuilds the whole tree
inside its trace (:meth:`ParamPack.unpacked`). Anywhere else (several devices, an
accelerator), nothing is packed and ``args`` are the weights themselves.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import hashlib
from collections.abc import Iterator, Sequence

import jax
import numpy as np

from pagedjax.kernels_pallas import packed

SMALL_BYTES = 1 << 20  # a 1-D weight up to this size is packed whatever reads it
TRIM_BYTES = 16 << 20  # with release: the freed heap is given back every this many bytes
# dtypes a host buffer can hand to JAX without a copy
PLAIN_DTYPES = frozenset(np.dtype(t) for t in ("uint8", "int8", "uint16", "int16", "float16",
                                               "uint32", "int32", "float32"))


def small(leaf) -> bool:
    """A small 1-D weight (a norm's scale, a bias)."""
    return len(leaf.shape) == 1 and 0 < leaf.size * leaf.dtype.itemsize <= SMALL_BYTES


class ParamPack:
    """Weights (``leaves``, in tree order), those at ``select`` packed into one buffer
    when that buffer and its views can share host memory; else none packed.
    ``release``: the caller hands the weights over, and each packed one is freed as
    soon as it is copied (the load's peak memory then grows by a few dozen MB, not by
    the packed weights)."""

    def __init__(self, leaves: Sequence[jax.Array], select: Sequence[bool] = (),
                 release: bool = False):
        leaves = list(leaves)
        at = [i for i, s in enumerate(select) if s and np.dtype(leaves[i].dtype) in PLAIN_DTYPES
              and leaves[i].size > 0]
        self.entries: list[packed.Entry] = []
        self.at: tuple[int, ...] = ()
        self.buffer = None
        if len(at) > 1:
            entries, size = packed.layout([leaves[i] for i in at])
            shared = _share(entries, size)
            if shared is not None:
                self.buffer, host, views = shared
                copied = 0
                counts = collections.Counter(map(id, leaves))  # an array at two places stays
                for i, e, v in zip(at, entries, views):
                    host[e.offset:e.offset + e.nbytes] = \
                        np.ascontiguousarray(leaves[i]).reshape(-1).view(np.uint8)
                    if release and isinstance(leaves[i], jax.Array) and counts[id(leaves[i])] == 1:
                        leaves[i].delete()
                        copied += e.nbytes
                        if copied >= TRIM_BYTES:  # give the freed memory back as we go
                            copied = 0
                            _trim()
                    leaves[i] = v
                if release:
                    _trim()
                self.entries, self.at = entries, tuple(at)
        self.leaves = tuple(leaves)
        self.args = self.args_of(self.leaves)  # the step program's parameter arguments

    def args_of(self, leaves: Sequence) -> tuple:
        """The step program's parameter arguments for ``leaves`` (which :meth:`holds`):
        the buffer, then the leaves not packed."""
        picked = set(self.at)
        rest = tuple(leaf for i, leaf in enumerate(leaves) if i not in picked)
        return rest if self.buffer is None else (self.buffer,) + rest

    @property
    def key(self) -> str:
        """What the compiled step depends on besides the arguments' types: the layout."""
        text = repr([(i, e.offset, e.shape, e.dtype.str) for i, e in zip(self.at, self.entries)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def holds(self, leaves: Sequence) -> bool:
        """Whether ``leaves`` keep this pack's own arrays where it packed (so it still
        serves them: LoRA writes replace other weights)."""
        return all(leaves[i] is self.leaves[i] for i in self.at)

    @contextlib.contextmanager
    def unpacked(self, args: Sequence) -> Iterator[list]:
        """In the step's trace: every leaf, in tree order, from ``args``; the packed
        ones as views of the buffer (kernels_pallas/packed.py: the C++ kernels read
        those in place while the block is open)."""
        if self.buffer is None:
            yield list(args)
            return
        with packed.views(args[0], self.entries) as views:
            out, rest, vi = [], iter(args[1:]), iter(views)
            picked = set(self.at)
            for i in range(len(self.leaves)):
                out.append(next(vi) if i in picked else next(rest))
            yield out


def _share(entries: list[packed.Entry], size: int):
    """One aligned host buffer for ``entries``, to be filled: (the buffer as a JAX array,
    the host array, each entry's JAX view of it), or None where JAX would copy them."""
    raw = np.empty(size + packed.ALIGN, np.uint8)
    start = (-raw.ctypes.data) % packed.ALIGN
    host = raw[start:start + size]
    # Aliased, not copied (checked below), and uncommitted like the loaded weights (a
    # committed one would make the programs it feeds compile again for committed inputs).
    try:
        buffer = jax.device_put(host, may_alias=True)
        views = [jax.device_put(host[e.offset:e.offset + e.nbytes].view(e.dtype)
                                .reshape(e.shape), may_alias=True) for e in entries]
    except TypeError:  # a JAX without device_put's may_alias: nothing is packed
        return None
    base = host.ctypes.data
    if buffer.unsafe_buffer_pointer() != base or any(
            v.unsafe_buffer_pointer() != base + e.offset for v, e in zip(views, entries)):
        return None
    return buffer, host, views


def _trim() -> None:
    """Return the C heap's free pages to the OS (glibc; elsewhere nothing): the freed
    weights would otherwise stay in the process's resident memory."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def select(model, params, blocks: bool) -> list[bool]:
    """Which of ``params``' leaves (tree order) to pack: small 1-D weights, and with
    ``blocks`` (every step runs the C++ block kernel) the components of the Linear
    layers' weights that kernel multiplies (``model.quantized``'s block kinds)."""
    from flax import nnx

    from pagedjax.models import nn
    from pagedjax.models import quant as Q

    block_paths = set()
    quantized = getattr(model, "quantized", {})
    abstract = getattr(model, "abstract", None)  # (CausalLM's module, shapes only)
    if blocks and abstract is not None and any(Q.block_kernel_kind(k) for k in quantized.values()):
        nodes = dict(nnx.iter_graph(abstract))
        block_paths = {"/".join(map(str, path)) for path, kind in quantized.items()
                       if Q.block_kernel_kind(kind)
                       and isinstance(nodes.get(tuple(path[:-1])), nn.Linear)}
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return [small(leaf) or jax.tree_util.keystr(path[:-1], simple=True, separator="/")
            in block_paths for path, leaf in flat]
