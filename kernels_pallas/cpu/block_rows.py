"""Where the C++ GGUF block kernel pays, on this machine: its row limit, and
whether it beats float32 weights at every row count (the default for GGUF files).

Measured once per machine and kernel build, like the float limit
(matmul_rows.py): SmolLM2-shaped ``[rows, 576] @ [576, 1536]`` Q4_1 weights
(the default model's format), over ``n_weights`` distinct matrices so that
they come from memory as a model's do, at ``CANDIDATE_ROWS``, three ways in
alternating order:

  block    the C++ block kernel (blockmatmul.cc) on the quantized weights
  jnp      the quantized weights' other path: dequantized in the step (models/quant.py)
  float    the same weights dequantized at load: the float32 path a step takes
           (the C++ float matmul up to its own row limit, XLA's GEMM above)

``rows`` (the block kernel's limit, ``plan.block_matmul_rows``) is
``matmul_rows.choose_rows`` of block against jnp: steps of up to that many rows
run the kernel when a model keeps its blocks. ``default`` is True when block
beats float at every measured row count, and the limit covers them all: then
GGUF files keep their blocks on the CPU unless ``quantization="none"``.
Cached beside the build (``<cache>/native/cpu_blockmatmul_<key>.block_rows.json``).
``PAGEDJAX_BLOCK_MATMUL_ROWS=<n>`` sets the limit instead (0 turns the kernel
off, and with it the default).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from pagedjax.kernels_pallas.cpu import matmul_rows

ENV = "PAGEDJAX_BLOCK_MATMUL_ROWS"
CANDIDATE_ROWS = (1, 4, 16, 64, 128, 256)
FORMAT = 1

_lock = threading.Lock()
_chosen: dict | None = None


def _weights(n_weights: int, k: int, n: int) -> list[dict]:
    """Random Q4_1 components [k/2, n] / [k/32, n] (models/quant.py's layout)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n_weights):
        qs = rng.integers(0, 256, (k // 2, n)).astype(np.uint8)
        d = (rng.random((k // 32, n)) * 0.01 + 0.001).astype(np.float16)
        m = (-8 * d.astype(np.float32)).astype(np.float16)
        out.append({"qs": jnp.asarray(qs), "d": jnp.asarray(d), "m": jnp.asarray(m)})
    return out


def measure(dequantize, quant_matmul, float_matmul, rows=CANDIDATE_ROWS, reps: int = 5,
            n_weights: int = 16, k: int = 576, n: int = 1536) -> dict[int, dict[str, float]]:
    """rows -> {"block", "jnp", "float"} best seconds of ``reps`` jitted calls over
    ``n_weights`` distinct weights. The models' paths come from the caller (this
    package does not import the models): ``dequantize(comps) -> w [k, n]``,
    ``quant_matmul(x, comps)`` (the step's jnp path for quantized weights) and
    ``float_matmul(x, w)`` (the step's float32 path)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pagedjax.kernels_pallas.cpu import blockmatmul

    qs = _weights(n_weights, k, n)
    ws = [jax.block_until_ready(dequantize(q)) for q in qs]
    fns = {
        "block": (jax.jit(lambda x, qs: [blockmatmul.blockmatmul("q4_1", q, x) for q in qs]), qs),
        "jnp": (jax.jit(lambda x, qs: [quant_matmul(x, q) for q in qs]), qs),
        "float": (jax.jit(lambda x, ws: [float_matmul(x, w) for w in ws]), ws),
    }
    rng = np.random.default_rng(1)
    out = {}
    for r in rows:
        x = jnp.asarray(rng.standard_normal((r, k), np.float32))
        best = dict.fromkeys(fns, float("inf"))
        for f, a in fns.values():
            jax.block_until_ready(f(x, a))  # compile, warm
        names = list(fns)
        for i in range(reps):
            for name in names if i % 2 == 0 else names[::-1]:
                f, a = fns[name]
                t = time.perf_counter()
                jax.block_until_ready(f(x, a))
                best[name] = min(best[name], time.perf_counter() - t)
        out[r] = best
    return out


def choose(timings: dict[int, dict[str, float]]) -> dict:
    """{"rows": the block kernel's limit, "default": beats float at every count}."""
    rows = matmul_rows.choose_rows({r: (t["block"], t["jnp"]) for r, t in timings.items()})
    wins = all(t["block"] < t["float"] for t in timings.values())
    return {"rows": rows, "default": bool(wins and rows >= max(timings))}


def cache_path(library: str | os.PathLike) -> Path:
    return Path(library).with_suffix(".block_rows.json")


def read_cache(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    rows, default = data.get("rows"), data.get("default")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0 or \
            not isinstance(default, bool):
        return None
    return {"rows": rows, "default": default}


def write_cache(path: Path, choice: dict, timings: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, **choice,
            "timings_s": {str(r): t for r, t in timings.items()}}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def env_override() -> dict | None:
    v = os.environ.get(ENV, "").strip()
    if not v:
        return None
    try:
        rows = int(v)
    except ValueError:
        rows = -1
    if rows < 0:
        raise ValueError(f"{ENV}={v!r}: expected a non-negative integer (the most rows a "
                         "step may have to run GGUF block matmuls in the C++ kernel; 0: never)")
    return {"rows": rows, "default": rows > 0}


def decide(library, measure_fn) -> dict:
    """The choice for the build at ``library``: the environment's, else cached, else
    measured (``measure_fn() -> timings``) and cached. Off without a library."""
    override = env_override()
    if override is not None:
        return override
    if library is None:
        return {"rows": 0, "default": False}
    path = cache_path(library)
    cached = read_cache(path)
    if cached is not None:
        return cached
    timings = measure_fn()
    choice = choose(timings)
    try:
        write_cache(path, choice, timings)
    except OSError:
        pass
    return choice


def block_rows(measure_fn) -> dict:
    """This process's choice, decided once ({"rows": 0, "default": False} when the
    vectorized kernel is not built). ``measure_fn`` as in :func:`decide`."""
    global _chosen
    with _lock:
        if _chosen is None:
            from pagedjax.kernels_pallas.cpu import blockmatmul

            lib = blockmatmul.library_path() if blockmatmul.fast() else None
            _chosen = decide(lib, measure_fn)
        return dict(_chosen)
