"""Compiled programs kept on disk whole, so a warm start neither traces nor lowers.

JAX's persistent compilation cache (engine/compile_cache.py) keys a program by
the hash of its lowered text: to find an entry, every start first traces the
Python function and lowers it, about 0.1-0.2 s per model program on a CPU,
seconds for warm-up's 69. A :class:`StoredJit` wraps one of the runner's
jitted functions and keeps each program it compiles as a serialized
executable (``jax.experimental.serialize_executable``) under a key of its own,
computed without tracing; the next process deserializes it and calls it
directly.

The key (:func:`program_key`) hashes everything the program depends on:

* the code: every ``.py`` file of ``pagedjax`` (with ``pagedjax.models`` and
  ``pagedjax.kernels_pallas``), by content;
* the software and machine: the store lives inside the compilation cache's
  namespace folder (pagedjax, jax and jaxlib versions, platform, devices,
  processor and ISA flags); ``XLA_FLAGS`` and the JAX settings that change
  lowering;
* the model: architecture, config, dtype, quantized weights, LoRA slots;
* the runner's settings (page size, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``max_model_len``) and the call itself: every argument's tree, shapes, dtypes
  and shardings, and the static arguments (the packed inputs' layout, the
  execution plan, the sampler variant).

A changed setting is a new key, never an old entry read back; an entry whose
argument types still do not match the call (``Compiled`` checks them) is
dropped and the program compiled again. Where no store folder is set
(:func:`set_root` with None) a ``StoredJit`` is its jitted function.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import tempfile
import threading
from typing import Any, Callable

import jax
import numpy as np

logger = logging.getLogger("pagedjax.worker.program_store")

_root: str | None = None  # the folder of this process's entries, or None: no store

# JAX settings that change how a function lowers (beside XLA_FLAGS).
_JAX_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_rank_promotion",
                 "jax_numpy_dtype_promotion", "jax_default_prng_impl",
                 "jax_threefry_partitionable", "jax_enable_checks", "jax_debug_nans",
                 "jax_debug_infs", "jax_disable_jit", "jax_use_shardy_partitioner")

# Process-wide counts: programs traced and lowered here, read back from the store.
counts = {"lowered": 0, "loaded": 0, "stored": 0}
_MISSING = object()
_FORMAT = "pagedjax-program-3"  # the entries' layout, part of every key
_count_lock = threading.Lock()


# Called with the count's name each time one changes (CompileCounter counts loads
# as programs read back).
listeners: list[Callable[[str], None]] = []


def _bump(name: str) -> None:
    with _count_lock:
        counts[name] += 1
    for fn in listeners:
        fn(name)


# Programs JAX read back from its persistent cache in this thread. An executable
# JAX deserialized cannot be serialized again whole (XLA:CPU keeps no object code
# for it: the copy fails when run with "Function ... not found"), so only fresh
# compilations are stored. JAX also hands such an executable back from memory,
# without the event, when the same program was read back earlier in the process
# (a direct call of the jitted function): carries_code checks the bytes too.
_thread = threading.local()
_listening = False


def _jax_cache_hit(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _thread.jax_hits = getattr(_thread, "jax_hits", 0) + 1


# The start of every object file XLA:CPU keeps in an executable: the ELF magic,
# then 64-bit (class 2), little-endian (data 1), version 1.
_ELF = b"\x7fELF\x02\x01\x01"


def carries_code(payload: bytes) -> bool:
    """Whether a serialized XLA:CPU executable holds the object code of its kernels.

    A freshly compiled executable serializes with its kernels' object files; one
    that was itself deserialized serializes without them and fails when run in
    the next process. A program without any compiled kernel (only custom calls)
    is not stored either: it traces again next time, which is merely slower."""
    return _ELF in payload


def set_root(path: str | None) -> None:
    """Keep programs under ``path`` (None: keep none); engine/compile_cache.py sets it."""
    global _root, _listening
    if path is not None and not _listening:
        jax.monitoring.register_event_listener(_jax_cache_hit)
        _listening = True
    _root = path


def root() -> str | None:
    return _root


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of every ``.py`` file of pagedjax, its models and its kernels, by content."""
    import pagedjax
    import pagedjax.kernels_pallas
    import pagedjax.models

    h = hashlib.sha256()
    for pkg in (pagedjax, pagedjax.models, pagedjax.kernels_pallas):
        for top in pkg.__path__:
            for folder, dirs, files in os.walk(top):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(f for f in files if f.endswith(".py")):
                    path = os.path.join(folder, name)
                    h.update(os.path.relpath(path, top).encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
    return h.hexdigest()


def settings_fingerprint() -> str:
    """XLA_FLAGS and the JAX settings that change lowering."""
    vals = [(k, repr(getattr(jax.config, k, None))) for k in _JAX_SETTINGS]
    return repr((os.environ.get("XLA_FLAGS", ""), vals))


def _leaf_sig(x, shardings: bool) -> tuple:
    sig = (tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__)))
    if not shardings:
        return sig
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        sharding = None
    return (*sig, None if sharding is None else repr(sharding))


def signature(args, shardings: bool = True) -> tuple:
    """The tree, shapes, dtypes and (``shardings``: multi-device) shardings of ``args``."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    return (repr(treedef), tuple(_leaf_sig(x, shardings) for x in leaves))


def local_signature(args) -> tuple:
    """What :func:`signature` (without shardings) tells apart, as a key within this
    process: the tree and each leaf's shape and dtype as objects, no reprs (it is
    computed at every call)."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    return (treedef, tuple((np.shape(x), getattr(x, "dtype", type(x))) for x in leaves))


def model_fingerprint(model) -> str:
    """What a model's programs depend on beside their arguments: its module,
    config, dtype, quantized weights and LoRA slots."""
    import json

    cls = getattr(model, "module_cls", type(model))
    config = getattr(model, "config", None)
    return repr((f"{cls.__module__}.{cls.__qualname__}", type(model).__qualname__,
                 json.dumps(config, sort_keys=True, default=repr),
                 str(getattr(model, "dtype", None)),
                 sorted(map(repr, getattr(model, "quantized", {}).items())),
                 repr(getattr(model, "lora", None))))


def program_key(*parts: Any) -> str:
    """The store key of a program: a hash of the code, the settings and ``parts``."""
    h = hashlib.sha256()
    for p in (_FORMAT, code_fingerprint(), settings_fingerprint(), *parts):
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def spans_local_devices(num_devices: int) -> bool:
    """Whether a program over ``num_devices`` can be stored: ``deserialize_and_load``
    places a stored program on every local device, so one compiled for fewer (TP=1
    or TP=2 beside 4 forced host devices) would expect as many shards as there are
    devices when read back."""
    return num_devices == jax.local_device_count()


class StoredJit:
    """``jit_fn`` with its compiled programs kept in the store (module docstring).

    ``fixed``: how many leading arguments keep their types for the life of the
    wrapper (the weights, the KV pool); their signature is taken once and only
    the other arguments' types and the static keywords pick a program per
    call. ``context``: what else the program depends on (the model, the
    runner's settings), part of every key. ``stored=False``: always the jitted
    function (a program that does not span every local device: a stored program
    is read back onto all of them, see :func:`spans_local_devices`)."""

    def __init__(self, jit_fn, name: str, context: Any, fixed: int = 0, stored: bool = True):
        self.jit_fn = jit_fn
        self.stored = stored
        self.name = name
        self.context = context
        self.fixed = fixed
        self._fixed_sig = None
        self._programs: dict[tuple, Callable] = {}
        self._lock = threading.Lock()

    def _local_key(self, args, kw) -> tuple:
        rest = args[self.fixed:]
        return (len(args), tuple(sorted(kw.items())), local_signature(rest) if rest else None)

    def __call__(self, *args, **kw):
        if _root is None or not self.stored:
            return self.jit_fn(*args, **kw)
        local = self._local_key(args, kw)
        program = self._programs.get(local, _MISSING)
        if program is _MISSING:
            program = self._obtain(args, kw, local)
        if program is None:  # an entry that did not take its call: jit's own path
            return self.jit_fn(*args, **kw)
        try:
            return program(*args)
        except (TypeError, ValueError):  # (checked before anything runs or is donated)
            logger.warning("the %s program does not take this call's arguments; using the "
                           "jitted function", self.name, exc_info=True)
            with self._lock:
                self._programs[local] = None
            return self.jit_fn(*args, **kw)

    def compile(self, *args, **kw):
        """Obtain the program of these arguments (read back or compiled) without
        running it; arguments may be ``jax.ShapeDtypeStruct``."""
        if _root is None or not self.stored:
            return self.jit_fn.lower(*args, **kw).compile()
        local = self._local_key(args, kw)
        program = self._programs.get(local, _MISSING)
        if program is _MISSING:
            return self._obtain(args, kw, local)
        return program if program is not None else self.jit_fn.lower(*args, **kw).compile()

    def lower(self, *args, **kw):
        return self.jit_fn.lower(*args, **kw)

    def _obtain(self, args, kw, local):
        if self._fixed_sig is None:
            self._fixed_sig = signature(args[:self.fixed])
        key = program_key(self.name, self.context, self._fixed_sig, local,
                          signature(args[self.fixed:]))
        program = _load(key)
        if program is None:
            _bump("lowered")
            hits = getattr(_thread, "jax_hits", 0)
            program = self.jit_fn.lower(*args, **kw).compile()
            if getattr(_thread, "jax_hits", 0) == hits:  # compiled here, not read back
                _save(key, program)
        else:
            _bump("loaded")
        with self._lock:
            self._programs[local] = program
        return program


def _path(key: str) -> str:
    return os.path.join(_root, "programs", key[:2], key + ".bin")


def _load(key: str):
    from jax.experimental.serialize_executable import deserialize_and_load

    path = _path(key)
    try:
        with open(path, "rb") as f:
            payload, in_tree, out_tree = pickle.load(f)
        if not carries_code(payload):
            raise ValueError("the entry holds no object code")
        return deserialize_and_load(payload, in_tree, out_tree)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged or foreign entry: compile instead
        logger.warning("stored program %s could not be read back; compiling it", path,
                       exc_info=True)
        return None


def _save(key: str, compiled) -> None:
    from jax.experimental.serialize_executable import serialize

    path = _path(key)
    try:
        payload, in_tree, out_tree = serialize(compiled)
        if not carries_code(payload):
            logger.debug("program %s not stored: it was read back, not compiled here", key)
            return
        data = pickle.dumps((payload, in_tree, out_tree))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        _bump("stored")
    except Exception:  # noqa: BLE001 - not serializable here (or disk full): run uncached
        logger.debug("program %s not stored", key, exc_info=True)
