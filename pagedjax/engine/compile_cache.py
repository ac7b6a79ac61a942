"""The persistent compilation cache: compiled XLA programs kept between starts.

Where it lives: ``<root>/<namespace>/``, where ``root`` is
``EngineArgs.compilation_cache_dir`` (``--compilation-cache-dir``) or, by
default, ``$PAGEDJAX_CACHE/xla`` (``~/.cache/pagedjax/xla``). Clearing it is
deleting that folder (``rm -rf ~/.cache/pagedjax/xla``); the next start
compiles everything again and refills it.

Two keys pick an entry, so that nothing compiled for another machine, software
or setting is ever read back:

* the **namespace** folder (:func:`namespace`): a hash of the pagedjax, jax and
  jaxlib versions, the backend's platform and version, the kind and number of
  devices and, on the CPU platform, the processor model and instruction-set
  flags (XLA compiles CPU programs for the host's ISA; a cache on a shared home
  folder must not hand an AVX-512 program to a machine without AVX-512);
* inside it, JAX's own key of each program: a hash of the program text (every
  shape and static argument: the model's architecture and sizes, the bucket,
  ``max_num_seqs``' row buckets, the attention backend, the sampler variant),
  the compile options and the XLA flags. Weights are arguments, never
  constants, so two checkpoints of one architecture share their programs
  rightly.

Every program is kept, however quickly it compiled or small it is
(``jax_persistent_cache_min_compile_time_secs = 0``,
``jax_persistent_cache_min_entry_size_bytes = 0``): a warm start reads every
program back instead of compiling the quick ones again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform

import jax

logger = logging.getLogger("pagedjax.engine.compile_cache")

_active: str | None = None  # the folder this process's cache was pointed at


def cpu_signature() -> str:
    """The processor model and ISA flags (what XLA's CPU code generation depends on)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = {ln.strip() for ln in f
                     if ln.startswith(("model name", "flags", "Features", "CPU part"))}
        if lines:
            return "\n".join(sorted(lines))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def namespace_parts() -> dict[str, str]:
    """Everything the namespace folder's hash covers, by name."""
    import jaxlib

    import pagedjax

    devices = jax.devices()
    backend = devices[0].client
    parts = {
        "pagedjax": pagedjax.__version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": backend.platform,
        "platform_version": str(backend.platform_version),
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "processes": str(jax.process_count()),
    }
    if backend.platform == "cpu":
        parts["cpu"] = cpu_signature()
    return parts


def namespace(parts: dict[str, str] | None = None) -> str:
    """``<platform>-<16 hex digits>``: the folder of this machine's and software's entries."""
    parts = namespace_parts() if parts is None else parts
    digest = hashlib.sha256(repr(sorted(parts.items())).encode()).hexdigest()[:16]
    return f"{parts.get('platform', 'any')}-{digest}"


def default_root() -> str:
    from pagedjax.config import default_cache_dir

    return os.path.join(default_cache_dir(), "xla")


def cache_path(root: str | None = None) -> str:
    """The folder this process reads and writes: ``<root>/<namespace>``."""
    return os.path.join(os.path.expanduser(root or default_root()), namespace())


def enable(root: str | None = None) -> str | None:
    """Point JAX's persistent compilation cache at :func:`cache_path` and keep every
    program there. Returns the folder (None where this jax lacks the options)."""
    global _active
    path = cache_path(root)
    try:
        from jax.experimental.compilation_cache import compilation_cache as cc

        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        if _active is not None and _active != path:
            cc.reset_cache()  # JAX opens its cache once: reopen it at the new folder
    except Exception:  # noqa: BLE001 - an old jax without these options: run uncached
        logger.warning("this jax has no persistent compilation cache; every start compiles")
        return None
    _active = path
    from pagedjax.worker import program_store

    # Whole programs on disk (program_store.py) skip tracing on a warm start; its
    # check that an entry carries its object code is XLA:CPU's, so on other
    # platforms programs come back through JAX's cache alone.
    program_store.set_root(path if jax.default_backend() == "cpu" else None)
    return path
