"""What a benchmark ran on: CPU model and flags, cores, load, library versions.

Every benchmark JSON carries ``machine()`` so that a figure can be read with
the machine it came from (absolute times move 2.5x between the developers'
VMs). ``loadavg()`` is recorded before and after each measured system: the
development VMs are shared, and a busy neighbour shows up there.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

# Flags that decide which kernels and instruction paths a CPU can run.
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                "avx512dq", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
                "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd", "sve")


def cpuinfo() -> dict:
    """CPU model, all flags and the vector-relevant subset, from /proc/cpuinfo."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key in ("model name", "Hardware") and model in ("", platform.machine(),
                                                                   platform.processor()):
                    model = val.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = val.split()
    except OSError:
        pass
    return {"model": model, "vector_flags": [f for f in VECTOR_FLAGS if f in flags],
            "flags": flags}


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages (None where /proc/loadavg is missing)."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """The machine and software a benchmark ran with (no heavy imports)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpu": cpuinfo(), "cpus": os.cpu_count(), "cpus_usable": affinity,
            "memory_gib": None if mem is None else round(mem, 1),
            "platform": platform.platform(), "python": sys.version.split()[0],
            "versions": {d: _version(d) for d in ("jax", "jaxlib", "torch", "transformers",
                                                  "numpy")},
            "loadavg": loadavg()}


def describe(m: dict) -> str:
    """One line for a table footer."""
    v = m["versions"]
    return (f"{m['cpu']['model']}, {m['cpus']} cores, {' '.join(m['cpu']['vector_flags'])}; "
            f"jax {v['jax']}, torch {v['torch']}, transformers {v['transformers']}; "
            f"load {m['loadavg']}")
