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
import itertools
import os

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from pagedjax.kernels_pallas.pallas import mosaic_tpu

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
    """Lower and compile for ``device`` (Mosaic asks the default device its chip kind)."""
    with jax.default_device(device):
        yield


@dataclasses.dataclass(frozen=True)
class TpuVariant:
    kind: str = "decode"
    head_dim: int = 128
    group: int = 1
    page_dtype: str = "bfloat16"
    page_size: int = 16
    window: bool = False
    soft_cap: bool = False
    pages_per_block: int | None = None  # None: the kernel's own choice
    num_kv_heads: int = 2
    pages_per_seq: int = 64

    @property
    def label(self) -> str:
        feats = "+".join(f for f, on in (("window", self.window), ("softcap", self.soft_cap))
                         if on) or "-"
        ppb = f" ppb{self.pages_per_block}" if self.pages_per_block else ""
        return (f"{self.kind} d{self.head_dim} g{self.group} {self.page_dtype} "
                f"ps{self.page_size} {feats}{ppb}")


def _args(v: TpuVariant, device):
    t, s = (64, 64) if v.kind == "decode" else (512, 16)
    hkv, d, ps = v.num_kv_heads, v.head_dim, v.page_size
    n = s * v.pages_per_seq + 1
    sh = SingleDeviceSharding(device)
    sds = lambda shape, dt: jax.ShapeDtypeStruct(shape, jnp.dtype(dt), sharding=sh)  # noqa: E731
    args = [sds((t, v.group * hkv, d), jnp.bfloat16), sds((n, 2, hkv, ps, d), v.page_dtype),
            sds((s,), jnp.int32), sds((s, v.pages_per_seq), jnp.int32),
            sds((s + 1,), jnp.int32), sds((1,), jnp.int32)]
    if v.page_dtype != "bfloat16":
        args.append(sds((n, 2, hkv, ps), jnp.float32))
    return args


def compile_variant(v: TpuVariant, chip: str = "v5e",
                    vmem_limit_bytes: int = HEADROOM_VMEM_LIMIT):
    """libtpu's compiled executable of ``v`` on one ``chip`` ("v5e" / "v6e").
    Any Mosaic or XLA error propagates."""
    device = tpu_devices(f"{chip}:1x1")[0]

    def fn(q, kv, kv_lens, page_table, cu_q_lens, num_seqs, scales=None):
        return mosaic_tpu.ragged_paged_attention(
            q, kv, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=v.head_dim ** -0.5,
            sliding_window=4096 if v.window else None, soft_cap=50.0 if v.soft_cap else None,
            kv_scales=scales, max_q_len=1 if v.kind == "decode" else None,
            pages_per_block=v.pages_per_block, vmem_limit_bytes=vmem_limit_bytes)

    with on_device(device):
        return jax.jit(fn).lower(*_args(v, device)).compile()


def full_matrix() -> list[TpuVariant]:
    """Decode and mixed, head sizes 64/128/256, bf16/int8/fp8 pages, pages of
    16 and 128 tokens, with and without window + soft cap (G = 4)."""
    return [TpuVariant(k, d, 4, dt, ps, f, f)
            for k, d, dt, ps, f in itertools.product(
                ("decode", "mixed"), (64, 128, 256), ("bfloat16", "int8", "float8_e4m3fn"),
                (16, 128), (False, True))]


def representative() -> list[TpuVariant]:
    return [TpuVariant("decode", 64, 3, "bfloat16", 16),
            TpuVariant("mixed", 128, 4, "bfloat16", 16, True, True),
            TpuVariant("decode", 128, 8, "int8", 16, False, True),
            TpuVariant("mixed", 256, 2, "float8_e4m3fn", 128, True, False)]
