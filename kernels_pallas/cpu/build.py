"""Builds the C++ CPU kernels with the system compiler and registers them with XLA.

Each source beside this file (attention.cc, matmul.cc, qmatmul.cc, blockmatmul.cc,
sampler.cc, with the shared headers *.h) is its own shared
library, compiled on first use with the system C++ compiler (``$CXX``, else
``g++``/``c++``/``clang++``) against the FFI headers jaxlib ships -- first for
this CPU's full instruction set (``-march=native``: AVX-512 where the CPU has
it), then AVX2 + FMA, then portable code. A build is used only after its
self-test (the library's ``PagedjaxSelfTest``, which runs every vectorized path
the build has) passed in a child process: a flag in /proc/cpuinfo is no proof
that the OS lets an instruction run, and a build machine's instruction set is
never assumed. The library is cached under ``$PAGEDJAX_CACHE_DIR`` (default
``~/.cache/pagedjax``), keyed by the source, the headers, the compiler, the
flags, the jaxlib version and the CPU; a build takes a few seconds once per
machine. ``FfiLibrary`` loads a built library and registers its FFI targets,
once per process; without a compiler (or with ``PAGEDJAX_CPU_NATIVE=0``) it
reports why and the callers keep their ``jnp`` paths.
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

# What ``build()`` compiles when no source is named: the attention kernel.
DEFAULT_SOURCE = Path(__file__).with_name("attention.cc")


def cache_dir() -> Path:
    return Path(os.environ.get("PAGEDJAX_CACHE_DIR") or Path.home() / ".cache" / "pagedjax")


def compiler() -> str | None:
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
    then (x86-64) AVX2 + FMA + F16C, then portable code. Each build must pass its
    self-test in a child process before it is used (see ``build``)."""
    sets = [["-O3", "-march=native"]]
    if platform.machine() in ("x86_64", "AMD64"):
        sets.append(["-O3", "-mavx2", "-mfma", "-mf16c"])  # every AVX2 CPU has F16C
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


def build(verbose: bool = False, source: Path | None = None, name: str = "cpu_kernels",
          flag_sets: list[list[str]] | None = None) -> Path:
    """Compile ``source`` (default: the attention kernel) or find it in the cache; returns the
    shared library's path (``<cache>/native/<name>_<key>.so``).

    Flag sets are tried best first (``default_flag_sets``); a build is kept
    only once its self-test ran in a child process, and a set that failed is
    remembered (``.rejected`` beside the cache) so it is not tried again on
    this machine. Raises RuntimeError with the compiler's messages when no set
    builds.
    """
    t0 = time.perf_counter()
    source = Path(source) if source is not None else DEFAULT_SOURCE
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set $CXX or install g++)")
    include = jax.ffi.include_dir()
    here = Path(source).parent
    # The source and every header beside it (isa.h, parallel.h, ...) make the cache key.
    src = Path(source).read_bytes() + b"".join(h.read_bytes() for h in sorted(here.glob("*.h")))
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    out_dir = cache_dir() / "native"
    errors, rejected = [], []
    for flags in flag_sets or default_flag_sets():
        # -ffp-contract=fast: every `a * b + c` of the vector code is one fused multiply-add
        # whatever the compiler's default for ISO C++ (GCC 12 fuses, later ones may not),
        # so the vector-typed sums match the FMA intrinsics' bits (the block kernel's
        # one-row path against its tiles: a row's bits must not depend on its batch).
        args = [*flags, "-std=c++17", "-ffp-contract=fast", "-shared", "-fPIC",
                f"-I{include}", f"-I{here}"]
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
