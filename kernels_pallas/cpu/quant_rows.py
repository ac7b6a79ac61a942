"""Where the quantized-weight C++ kernels pay, on this machine: each kernel's own
row limit, and whether the GGUF block kernel beats float32 weights at every row
count (then GGUF files keep their blocks by default).

Two kernels, each measured once per machine and build like the float limit
(matmul_rows.py; that limit is not theirs: a kernel that reads a quarter or an
eighth of the bytes wins at row counts where the float kernel loses):

  block   blockmatmul.cc on Q4_1 blocks (the default model's format)
  int8    qmatmul.cc on per-channel int8 weights

SmolLM2-shaped ``[rows, 576] @ [576, 1536]`` weights over ``n_weights``
distinct matrices (so that they come from memory as a model's do), at
``CANDIDATE_ROWS``, three ways in alternating order:

  cpp     the kernel on the quantized weights
  jnp     the same quantized weights' other path: dequantized in the step
  float   the weights dequantized at load: the float32 path of a step

``rows`` (``plan.block_matmul_rows`` / ``plan.int8_matmul_rows``) is
``matmul_rows.choose_rows`` of cpp against jnp: steps of up to that many rows
run the kernel when a model keeps such weights (block: every step, when cpp
wins up to the largest count). ``default`` (block only) is True when cpp beats
float at some measured count, is nowhere slower than float beyond ``TIE`` (5%:
the timings' noise where both run at the machine's multiply-add peak), and the
limit covers every count. The weights are four decoder layers' projections of
the default model's shapes. Cached beside the kernel's build
(``<so>.<kernel>_rows.json``);
``PAGEDJAX_BLOCK_MATMUL_ROWS`` / ``PAGEDJAX_INT8_MATMUL_ROWS`` set a limit instead
(0: never; for the block kernel a positive limit also makes it the default).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pagedjax.kernels_pallas.cpu import matmul_rows, row_limit

KERNELS = ("block", "int8")
ENV = {"block": "PAGEDJAX_BLOCK_MATMUL_ROWS", "int8": "PAGEDJAX_INT8_MATMUL_ROWS"}
CANDIDATE_ROWS = (1, 4, 16, 64, 128, 256)
FORMAT = 6  # 2: the tie rule; 3: a decoder layer's projection shapes; 4: EVERY_STEP;
#            5: the tied head beside the layers; 6: a count over the tie measured again
# At many rows both paths run at the machine's multiply-add peak, and one
# measurement's timings swing by several percent: the block kernel counts as
# "not slower" than float32 up to this ratio.
TIE = 1.05
EVERY_STEP = 1 << 30  # a block limit past every step: each runs the kernel

_lock = threading.Lock()
_chosen: dict[str, dict] = {}


def _weights(kernel: str, shapes) -> list[dict]:
    """Random components [k_c, n] of one weight per (k, n) in ``shapes`` (models/quant.py's
    layout)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for k, n in shapes:
        if kernel == "int8":
            q = rng.integers(-127, 128, (k, n)).astype(np.int8)
            scale = (rng.random(n) * 0.01 + 0.001).astype(np.float32)
            out.append({"q": jnp.asarray(q), "scale": jnp.asarray(scale)})
            continue
        qs = rng.integers(0, 256, (k // 2, n)).astype(np.uint8)
        d = (rng.random((k // 32, n)) * 0.01 + 0.001).astype(np.float16)
        m = (-8 * d.astype(np.float32)).astype(np.float16)
        out.append({"qs": jnp.asarray(qs), "d": jnp.asarray(d), "m": jnp.asarray(m)})
    return out


# A decoder layer's projections, (in, out) for hidden 576 and MLP 1536 (the default
# model's: qkv with 9 + 2 * 3 heads of 64, o, gate and up, down), four layers.
LAYER_SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))
MEASURED_SHAPES = LAYER_SHAPES * 4
# The tied LM head beside them (the block kernel's choice): the default model's Q8_0
# table [vocab, hidden], as many steps as the four layers (30 layers to one head: 4 / 30).
HEAD_SHAPE, HEAD_WEIGHT = (49152, 576), 4 / 30


def head_table(shape=HEAD_SHAPE) -> dict:
    """Random Q8_0 components of a tied table [V, H] quantized along H (codes of every
    value, small positive float16 scales)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(2)
    v, h = shape
    return {"q": jnp.asarray(rng.integers(-127, 128, (v, h)).astype(np.int8)),
            "d": jnp.asarray((rng.random((v, h // 32)) * 0.01 + 0.001).astype(np.float16))}


def kernel_fn(kernel: str):
    """The C++ kernel's ``(x, comps) -> x @ W``."""
    if kernel == "int8":
        from pagedjax.kernels_pallas.cpu import qmatmul

        return lambda x, c: qmatmul.qmatmul(x, c["q"], c["scale"])
    from pagedjax.kernels_pallas.cpu import blockmatmul

    return lambda x, c: blockmatmul.blockmatmul("q4_1", c, x)


def measure(kernel: str, dequantize, quant_matmul, float_matmul, rows=CANDIDATE_ROWS,
            reps: int = 9, shapes=MEASURED_SHAPES, head=None,
            confirm: int = 3) -> dict[int, dict[str, float]]:
    """rows -> {"cpp", "jnp", "float"} best seconds of ``reps`` jitted calls over one
    weight per (in, out) of ``shapes`` (default: four decoder layers' projections). The models' paths come from the caller (this
    package does not import the models): ``dequantize(kind, comps) -> w [k, n]``,
    ``quant_matmul(kind, x, comps)`` (the step's jnp path for quantized weights) and
    ``float_matmul(x, w)`` (the step's float32 path). ``head`` (the block kernel: the
    tied LM head, timed apart and added with ``HEAD_WEIGHT``): {"cpp", "jnp"} ``(x,
    comps) -> x @ table.T`` on :func:`head_table`'s components, "float" ``(x, w)`` on
    the table "dequantize"d ``(comps) -> w [V, H]``. A row count where the block kernel
    is slower than float32 beyond ``TIE`` gets up to ``confirm`` more series of ``reps``
    (the best of all of them counts)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    kind = "int8" if kernel == "int8" else "q4_1"
    qs = _weights(kernel, shapes)
    k = max(s[0] for s in shapes)
    ws = [jax.block_until_ready(dequantize(kind, q)) for q in qs]
    cpp = kernel_fn(kernel)
    fns = {
        "cpp": (jax.jit(lambda x, qs: [cpp(x[:, :k_in], q) for (k_in, _), q in zip(shapes, qs)]),
                qs),
        "jnp": (jax.jit(lambda x, qs: [quant_matmul(kind, x[:, :k_in], q)
                                       for (k_in, _), q in zip(shapes, qs)]), qs),
        "float": (jax.jit(lambda x, ws: [float_matmul(x[:, :k_in], w)
                                         for (k_in, _), w in zip(shapes, ws)]), ws),
    }
    if head is not None:
        table, t_in = head_table(), HEAD_SHAPE[1]
        w_table = jax.block_until_ready(head["dequantize"](table))
        for name in list(fns):
            fns[name + " head"] = (jax.jit(lambda x, t, f=head[name]: f(x[:, :t_in], t)),
                                   w_table if name == "float" else table)
    rng = np.random.default_rng(1)
    names = list(fns)

    def timed(x, best):  # best seconds of each path over ``reps`` more calls, in turn
        for i in range(reps):
            for name in names if i % 2 == 0 else names[::-1]:
                f, a = fns[name]
                t = time.perf_counter()
                jax.block_until_ready(f(x, a))
                best[name] = min(best[name], time.perf_counter() - t)
        return {name: best[name] + HEAD_WEIGHT * best.get(name + " head", 0.0)
                for name in ("cpp", "jnp", "float")}

    out = {}
    for r in rows:
        x = jnp.asarray(rng.standard_normal((r, k), np.float32))
        best = dict.fromkeys(fns, float("inf"))
        for f, a in fns.values():
            jax.block_until_ready(f(x, a))  # compile, warm
        out[r] = timed(x, best)
        # Where the kernel looks slower than float32 beyond the tie, the two may simply
        # be level (many rows: both at the multiply-add peak) and one series' best off
        # by its noise: more calls of both before the count decides anything.
        for _ in range(confirm):
            if kernel != "block" or out[r]["cpp"] <= TIE * out[r]["float"]:
                break
            out[r] = timed(x, best)
    return out


def choose(timings: dict[int, dict[str, float]], kernel: str = "block") -> dict:
    """{"rows": the kernel's limit, "default": GGUF files keep their blocks} for
    ``kernel``'s ``timings``. rows: the routing of cpp against jnp that saves most;
    the block kernel, winning up to the largest count, runs every step (it widens each
    block once per call however many rows share it). default (block only): cpp beats
    float somewhere and is nowhere slower beyond the timings' noise (``TIE``)."""
    rows = matmul_rows.choose_rows({r: (t["cpp"], t["jnp"]) for r, t in timings.items()})
    if kernel != "block":
        return {"rows": rows, "default": False}
    never_slower = all(t["cpp"] <= TIE * t["float"] for t in timings.values())
    faster = any(t["cpp"] < t["float"] for t in timings.values())
    covers = rows >= max(timings)
    return {"rows": EVERY_STEP if covers else rows,
            "default": bool(never_slower and faster and covers)}


def cache_path(library: str | os.PathLike, kernel: str) -> Path:
    return Path(library).with_suffix(f".{kernel}_rows.json")


def read_cache(path: Path) -> dict | None:
    data = row_limit.read_json(path, FORMAT)
    if data is None or not row_limit.is_rows(data.get("rows")) or \
            not isinstance(data.get("default"), bool):
        return None
    return {"rows": data["rows"], "default": data["default"]}


def write_cache(path: Path, choice: dict, timings: dict, load: dict | None = None) -> None:
    row_limit.write_json(path, {"format": FORMAT, **choice, **(load or {}),
                                "timings_s": {str(r): t for r, t in timings.items()}})


def env_override(kernel: str) -> dict | None:
    rows = row_limit.env_rows(ENV[kernel], f"{kernel} matmuls")
    if rows is None:
        return None
    return {"rows": rows, "default": kernel == "block" and rows > 0}


def decide(kernel: str, library, measure_fn) -> dict:
    """The choice for ``kernel``'s build at ``library``: the environment's, else cached,
    else measured (``measure_fn() -> timings``) and cached. Off without a library."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: {kernel!r} is not one of {KERNELS}")
    override = env_override(kernel)
    if override is not None:
        return override
    if library is None:
        return {"rows": 0, "default": False}

    def choose_for(timings):
        return choose(timings, kernel)

    return row_limit.cached(cache_path(library, kernel), read_cache, measure_fn, choose_for,
                            write_cache)


def _library(kernel: str) -> str | None:
    """The vectorized build of ``kernel`` (None when it is not built or is scalar)."""
    from pagedjax.kernels_pallas.cpu import blockmatmul, build, qmatmul

    if kernel == "int8":
        info = build.build_info("cpu_qmatmul") if qmatmul.fast() else None
        return info["so"] if info else None
    return blockmatmul.library_path() if blockmatmul.fast() else None


def kernel_rows(kernel: str, measure_fn) -> dict:
    """This process's choice for ``kernel``, decided once ({"rows": 0, "default":
    False} when its vectorized build is missing). ``measure_fn`` as in :func:`decide`."""
    with _lock:
        if kernel not in _chosen:
            _chosen[kernel] = decide(kernel, _library(kernel), measure_fn)
        return dict(_chosen[kernel])
