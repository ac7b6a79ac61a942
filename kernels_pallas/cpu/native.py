"""C++ kernels for the CPU, called through XLA's FFI: ragged paged attention and
the few-row matmuls of decode steps.

The sources (``cpu_native.cc``: attention; ``cpu_matmul.cc``: the matmul,
its own library; next to this file) are compiled on first use
with the system C++ compiler (``$CXX``, else ``g++``/``c++``/``clang++``)
against the FFI headers jaxlib ships -- first for this CPU's full instruction
set (``-march=native``: AVX-512 where the CPU has it), then AVX2 + FMA, then
portable code; a build is used only after its self-test ran in a child process
(a flag in /proc/cpuinfo is no proof that the OS lets an instruction run) --
and the shared library is cached under
``$PAGEDJAX_CACHE_DIR`` (default ``~/.cache/pagedjax``), keyed by the source,
the compiler, the flags, the jaxlib version and the CPU. A build takes a few
seconds once per machine. Without a compiler, ``available()`` is False and
``attention_backend="auto"`` keeps the XLA (pure jnp) path; set
``PAGEDJAX_CPU_NATIVE=0`` to force that. Each library is built the same way
(``FfiLibrary``, ``build``).

``ragged_paged_attention``: same contract and results as
``reference.ragged_paged_attention``; q in float32 or bfloat16, pages in
float32, bfloat16, int8 or float8_e4m3fn (with scales), head_dim a multiple of
8. Other cases run the reference. ``matmul``: float32 ``x @ w`` (or
``x @ w.T``); the models use it for steps of few tokens (models/layers.py).
Its int8-weight variant, ``(x @ q) * scale`` with q read as int8, is
``kernels_pallas/cpu_qmatmul.{py,cc}`` (its own library, built by ``build``
here); the models route int8 weights to it for the same steps.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.kernels_pallas import reference

TARGET = "pagedjax_ragged_paged_attention"
MATMUL_TARGET = "pagedjax_matmul"
SOURCE = Path(__file__).with_name("attention.cc")
MATMUL_SOURCE = Path(__file__).with_name("matmul.cc")
_Q_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_KV_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int8),
              jnp.dtype(jnp.float8_e4m3fn))



def cache_dir() -> Path:
    return Path(os.environ.get("PAGEDJAX_CACHE_DIR") or Path.home() / ".cache" / "pagedjax")


def _compiler() -> str | None:
    for c in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _cpu_tag() -> str:
    """What -march=native depends on: the CPU model and flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines()
                 if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def default_flag_sets() -> list[list[str]]:
    """Compiler flags to try, best first: the build machine's full instruction set,
    then (x86-64) AVX2 + FMA, then portable code. Each build must pass its
    self-test in a child process before it is used (see ``build``)."""
    sets = [["-O3", "-march=native"]]
    if platform.machine() in ("x86_64", "AMD64"):
        sets.append(["-O3", "-mavx2", "-mfma"])
    sets.append(["-O3"])
    return sets


def _self_test(so: Path) -> str | None:
    """Load ``so`` in a child process and run its PagedjaxSelfTest; None when it passed,
    else why not (a CPU or OS without an instruction the build used kills the child)."""
    code = ("import ctypes, sys\n"
            "sys.exit(ctypes.CDLL(sys.argv[1]).PagedjaxSelfTest())\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(so)], capture_output=True,
                           text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "self-test timed out after 120 s"
    if r.returncode == 0:
        return None
    if r.returncode < 0:
        return f"self-test killed by signal {-r.returncode} (an unsupported instruction?)"
    return f"self-test failed (exit {r.returncode}) {r.stderr[-500:]}"


_builds: dict = {}  # name -> {"so", "flags", "rejected": [(flags, reason)], "seconds", "cached"}


def build_info(name: str = "cpu_kernels") -> dict | None:
    """How ``name`` was built in this process: its flags, the flag sets rejected
    (with why), the seconds ``build`` took and whether the cache had it."""
    return _builds.get(name)


def build(verbose: bool = False, source: Path = SOURCE, name: str = "cpu_kernels",
          flag_sets: list[list[str]] | None = None) -> Path:
    """Compile ``source`` (default: the kernels) or find it in the cache; returns the
    shared library's path (``<cache>/native/<name>_<key>.so``).

    Flag sets are tried best first (``default_flag_sets``); a build is kept
    only once its self-test ran in a child process, and a set that failed is
    remembered (``.rejected`` beside the cache) so it is not tried again on
    this machine. Raises RuntimeError with the compiler's messages when no set
    builds.
    """
    t0 = time.perf_counter()
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set $CXX or install g++)")
    include = jax.ffi.include_dir()
    here = Path(source).parent
    # The source and every header beside it (cpu_simd.h) make the cache key.
    src = Path(source).read_bytes() + b"".join(h.read_bytes() for h in sorted(here.glob("*.h")))
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    out_dir = cache_dir() / "native"
    errors, rejected = [], []
    for flags in flag_sets or default_flag_sets():
        args = [*flags, "-std=c++17", "-shared", "-fPIC", f"-I{include}", f"-I{here}"]
        key = hashlib.sha256(b"\0".join([
            src, " ".join(args).encode(), version.encode(), jax.__version__.encode(),
            platform.machine().encode(), _cpu_tag().encode()])).hexdigest()[:20]
        so = out_dir / f"{name}_{key}.so"
        bad = so.with_suffix(".rejected")
        if so.exists():
            _builds[name] = {"so": str(so), "flags": flags, "rejected": rejected,
                             "seconds": time.perf_counter() - t0, "cached": True}
            return so
        if bad.exists():
            rejected.append((flags, bad.read_text()))
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            tmp_so = Path(tmp) / so.name
            cmd = [cxx, *args, str(source), "-o", str(tmp_so)]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except subprocess.TimeoutExpired:
                errors.append(f"$ {' '.join(cmd)}\ntimed out after 600 s")
                continue
            if verbose:
                print(" ".join(cmd), r.stderr, sep="\n")
            if r.returncode != 0:
                errors.append(f"$ {' '.join(cmd)}\n{r.stderr[-2000:]}")
                continue
            why = _self_test(tmp_so)
            if why is not None:
                bad.write_text(why)
                rejected.append((flags, why))
                errors.append(f"$ {' '.join(cmd)}\n{why}")
                continue
            os.replace(tmp_so, so)  # atomic: concurrent builders agree
            _builds[name] = {"so": str(so), "flags": flags, "rejected": rejected,
                             "seconds": time.perf_counter() - t0, "cached": False}
            return so
    raise RuntimeError(f"building the C++ CPU kernels failed ({Path(source).name}):\n"
                       + "\n".join(errors))


class FfiLibrary:
    """A C++ source built (``build``), loaded and its FFI targets registered with
    XLA, once, on first use (thread-safe). ``load()`` is the library or None;
    ``error`` says why there is none (no compiler, a failed build, or
    ``PAGEDJAX_CPU_NATIVE=0``)."""

    def __init__(self, source: Path, name: str, targets: dict[str, str]):
        self.source, self.name, self.targets = source, name, targets  # target -> symbol
        self._lock = threading.Lock()
        self._lib = None
        self.error: str | None = None

    def load(self):
        with self._lock:
            if self._lib is not None or self.error is not None:
                return self._lib
            if os.environ.get("PAGEDJAX_CPU_NATIVE", "1") == "0":
                self.error = "disabled by PAGEDJAX_CPU_NATIVE=0"
                return None
            try:
                lib = ctypes.cdll.LoadLibrary(str(build(source=self.source, name=self.name)))
                for target, symbol in self.targets.items():
                    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                                platform="cpu")
            except (RuntimeError, OSError, AttributeError) as e:
                self.error = str(e)
                return None
            self._lib = lib
            return lib

    def load_in_background(self) -> threading.Thread:
        """Start ``load()`` on a daemon thread, so that a first build (a compiler
        child process) runs beside the caller's work; a later ``load()`` waits
        for it (the lock)."""
        t = threading.Thread(target=self.load, name=f"pagedjax-build-{self.name}", daemon=True)
        t.start()
        return t


_KERNELS = FfiLibrary(SOURCE, "cpu_kernels", {TARGET: "PagedjaxRaggedPagedAttention"})
_MATMUL = FfiLibrary(MATMUL_SOURCE, "cpu_matmul", {MATMUL_TARGET: "PagedjaxMatmul"})
_load = _KERNELS.load


def load_in_background() -> list[threading.Thread]:
    """Build (or find in the cache) and register the attention kernel and the matmul
    on daemon threads."""
    return [_KERNELS.load_in_background(), _MATMUL.load_in_background()]


def available() -> bool:
    """True when the attention kernel is built (or was built now) and registered."""
    return _load() is not None


def fast_matmul() -> bool:
    """True when the matmul is built and has its vectorized (AVX2 + FMA) paths."""
    lib = _MATMUL.load()
    return lib is not None and bool(lib.PagedjaxFastMatmul())


def unavailable_reason() -> str | None:
    """Why the attention kernel is unavailable (None when it loaded)."""
    _load()
    return _KERNELS.error


def matmul_unavailable_reason() -> str | None:
    """Why the C++ matmul is unavailable (None when it loaded). It is a library of
    its own, so it can fail while the attention kernel loads; ``matmul`` then runs
    ``jnp``."""
    _MATMUL.load()
    return _MATMUL.error


def supports(q_dtype, kv_dtype, head_dim: int) -> bool:
    return (jnp.dtype(q_dtype) in _Q_DTYPES and jnp.dtype(kv_dtype) in _KV_DTYPES
            and head_dim % 8 == 0)


def ragged_paged_attention(
    q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, sm_scale: float,
    sliding_window: int | None = None, soft_cap: float | None = None, kv_scales=None,
    max_q_len: int | None = None,
):
    """See ``reference.py`` for the contract."""
    reference.check_args(q, kv_pages, kv_lens, page_table, cu_q_lens, kv_scales)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window: expected a positive int or None, got {sliding_window}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap: expected a positive float or None, got {soft_cap}")
    if kv_scales is not None and jnp.dtype(kv_scales.dtype) != jnp.dtype(jnp.float32):
        raise ValueError(f"kv_scales: expected float32, got {kv_scales.dtype}")
    if not supports(q.dtype, kv_pages.dtype, q.shape[-1]):
        return reference.ragged_paged_attention(
            q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=sm_scale,
            sliding_window=sliding_window, soft_cap=soft_cap, kv_scales=kv_scales,
            max_q_len=max_q_len)
    if not available():
        raise RuntimeError(f"attention_backend='cpu_native' is unavailable: "
                           f"{unavailable_reason()}; use attention_backend='xla'")
    i32 = jnp.int32
    scales = kv_scales if kv_scales is not None else jnp.zeros((1,), jnp.float32)
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype),
                            vmap_method="sequential")
    return call(q, kv_pages, scales, kv_lens.astype(i32),
                page_table.astype(i32), cu_q_lens.astype(i32),
                jnp.reshape(num_seqs, (1,)).astype(i32),
                sm_scale=np.float32(sm_scale), sliding_window=np.int32(sliding_window or 0),
                soft_cap=np.float32(soft_cap or 0.0), has_scales=np.int32(kv_scales is not None))


def matmul(x: jax.Array, w: jax.Array, *, transposed: bool = False) -> jax.Array:
    """``x [M, K] @ w [K, N]`` (``transposed``: ``x @ w[N, K].T``), float32.

    For the few-row matmuls of decode steps (see cpu_matmul.cc); other dtypes
    and ranks go to ``jnp``.
    """
    f32 = jnp.dtype(jnp.float32)
    if x.ndim != 2 or w.ndim != 2 or x.dtype != f32 or w.dtype != f32 or \
            _MATMUL.load() is None:
        return x @ (w.T if transposed else w)
    k = w.shape[1] if transposed else w.shape[0]
    if x.shape[1] != k:
        raise ValueError(f"matmul: x {x.shape} and w {w.shape} (transposed={transposed}) "
                         "do not match")
    n = w.shape[0] if transposed else w.shape[1]
    call = jax.ffi.ffi_call(MATMUL_TARGET, jax.ShapeDtypeStruct((x.shape[0], n), f32),
                            vmap_method="sequential")
    return call(x, w, transposed=np.int32(transposed))
