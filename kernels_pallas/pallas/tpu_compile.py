"""Compile the Mosaic kernel for a real TPU on a machine without one.

With ``libtpu`` installed, ``jax.experimental.topologies`` describes a TPU
slice by compile-only devices, and ``jax.jit(...).lower(...).compile()``
runs libtpu's compiler for them here. Mosaic's lowering asks the default
device for the chip's kind and core count, so lowering runs under
``jax.default_device`` of the target (:func:`on_device`).

:func:`compile_variant` compiles one kernel variant (decode or mixed, head
size, GQA group, page dtype and size, window, soft cap, pages per block) for
a chip, under a VMEM limit: the headroom check compiles every variant under
80% of the limit the kernel asks for (``mosaic_tpu`` passes 64 MiB of the
chip's 128 MiB), so none needs more than that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import jax
from jax.sharding import SingleDeviceSharding

from pagedjax.kernels_pallas.pallas import mosaic_tpu
from pagedjax.kernels_pallas.pallas import variant_axes as va

KERNEL_VMEM_LIMIT = 64 << 20  # what ragged_paged_attention asks for by default
HEADROOM_VMEM_LIMIT = int(0.8 * KERNEL_VMEM_LIMIT)


def libtpu_missing() -> str | None:
    """None when libtpu can compile here, else why not."""
    try:
        tpu_devices("v5e:1x1")
    except RuntimeError as e:
        return str(e)
    return None


def tpu_devices(topology: str) -> list:
    """Compile-only devices of a TPU slice such as ``"v5e:1x1"`` or ``"v6e:2x2"``
    (one host holds up to 2x2 chips; one chip is its own host). RuntimeError
    when libtpu is missing or the name is unknown."""
    from jax.experimental import topologies

    # Other processes on this host (test workers) may have libtpu loaded too.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    shape = topology.split(":", 1)[1] if ":" in topology else ""
    kw = dict(chips_per_host_bounds=(1, 1, 1)) if shape in ("1x1", "1x1x1") else {}
    try:
        return list(topologies.get_topology_desc(topology, "tpu", **kw).devices)
    except Exception as e:  # noqa: BLE001 - no libtpu, or a bad name
        raise RuntimeError(f"no device-less TPU target {topology!r} "
                           f"({type(e).__name__}: {str(e)[:300]})") from e


@contextlib.contextmanager
def on_device(device):
    """Lower and compile for ``device`` (Mosaic asks the default device its chip kind),
    with the persistent compilation cache off (:func:`no_persistent_cache`)."""
    with jax.default_device(device), no_persistent_cache():
        yield


@contextlib.contextmanager
def no_persistent_cache():
    """JAX's persistent compilation cache, if a folder is set, neither read nor
    written inside the block: an executable compiled for compile-only devices
    can be serialized but not read back without a client ("PjRtCompiler must be
    constructed with a Client"), so caching it only leaves entries that warn on
    every later compile. JAX decides once whether the cache is used; resetting
    it before and after makes it decide again (the folder reopens on the next
    compile outside)."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    try:
        before = jax.config.jax_enable_compilation_cache
    except AttributeError:  # a jax without the switch
        yield
        return
    jax.config.update("jax_enable_compilation_cache", False)
    cc.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        cc.reset_cache()


@dataclasses.dataclass(frozen=True)
class TpuVariant(va.Variant):
    """The shared attention axes (:mod:`variant_axes`) and the Mosaic kernel's
    pages per block (None: the kernel's own choice)."""

    pages_per_block: int | None = None

    @property
    def label(self) -> str:
        ppb = f" ppb{self.pages_per_block}" if self.pages_per_block else ""
        return f"{self.base_label}{ppb}"


def compile_variant(v: TpuVariant, chip: str = "v5e",
                    vmem_limit_bytes: int = HEADROOM_VMEM_LIMIT):
    """libtpu's compiled executable of ``v`` on one ``chip`` ("v5e" / "v6e").
    Any Mosaic or XLA error propagates."""
    device = tpu_devices(f"{chip}:1x1")[0]

    def fn(q, kv, kv_lens, page_table, cu_q_lens, num_seqs, scales=None):
        return mosaic_tpu.ragged_paged_attention(
            q, kv, kv_lens, page_table, cu_q_lens, num_seqs, kv_scales=scales,
            pages_per_block=v.pages_per_block, vmem_limit_bytes=vmem_limit_bytes,
            **v.attention_kwargs())

    with on_device(device):
        return jax.jit(fn).lower(*v.abstract_args(SingleDeviceSharding(device))).compile()


def full_matrix() -> list[TpuVariant]:
    """Decode and mixed, head sizes 64/128/256, bf16/int8/fp8 pages, pages of
    16 and 128 tokens, with and without window + soft cap (G = 4)."""
    return [TpuVariant(**axes) for axes in va.product(
        groups=(4,), page_sizes=(16, 128), features=((False, False), (True, True)))]


def representative() -> list[TpuVariant]:
    return [TpuVariant("decode", 64, 3, "bfloat16", 16),
            TpuVariant("mixed", 128, 4, "bfloat16", 16, True, True),
            TpuVariant("decode", 128, 8, "int8", 16, False, True),
            TpuVariant("mixed", 256, 2, "float8_e4m3fn", 128, True, False)]
