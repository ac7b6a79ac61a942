"""Compile the Triton kernel for a real GPU on a machine without one.

JAX lowers a Pallas-Triton call for the ``cuda`` platform to a custom call
(``__gpu$xla.gpu.triton``) whose backend config holds the kernel's Triton IR
(MLIR bytecode), its warps and its pipeline stages. :func:`capture` lowers a
function for ``cuda`` on any host and returns those kernels as Triton IR
text; :func:`compile_kernel` hands one to the ``triton`` package's own
compiler for a target GPU (``sm_90a`` for H100/H200, ``sm_80`` for A100), and
reads the resources of the result from the compiler's metadata (dynamic
shared memory) and from ``ptxas -v`` (registers, spills, static shared
memory: the log of the ptxas run, bundled with ``triton``, that made the cubin).

:func:`check` fails (:class:`CompileCheckError`) on a compile error, any
spilled byte, or shared memory beyond what one block may use on that SM, and
:func:`occupancy` says how many blocks of the kernel fit on one SM.

``triton`` is imported on first use only (a test dependency, pinned in
pyproject.toml to the versions that read this JAX's Triton IR).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import sys
import tempfile
from typing import Callable

import jax

_TARGET_CALL = "__gpu$xla.gpu.triton"


class CompileCheckError(RuntimeError):
    """A kernel that does not compile, spills, or overflows shared memory."""


@dataclasses.dataclass(frozen=True)
class SmLimits:
    """What one SM of an architecture offers (CUDA's occupancy tables)."""

    name: str
    cc: int  # compute capability, e.g. 90
    smem_per_block: int  # most shared memory one block may ask for (opt-in)
    smem_per_sm: int
    smem_reserved_per_block: int  # taken by the system from each block's share
    regs_per_sm: int = 65536
    regs_per_thread: int = 255
    warps_per_sm: int = 64
    blocks_per_sm: int = 32


ARCHS = {
    "sm_90a": SmLimits("sm_90a", 90, 232448, 233472, 1024),  # H100 / H200
    "sm_80": SmLimits("sm_80", 80, 166912, 167936, 1024),  # A100
}


@dataclasses.dataclass(frozen=True)
class TritonKernel:
    """One kernel as JAX lowered it: Triton IR text and launch settings."""

    name: str
    ttir: str
    num_warps: int
    num_stages: int


@dataclasses.dataclass(frozen=True)
class KernelResources:
    arch: str
    name: str
    num_warps: int
    num_stages: int
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int  # dynamic (Triton's) plus static
    # When it spilled: the spill stores of the same PTX through the same ptxas
    # without triton's ``--regAllocOptLevel=2`` (None: not measured).
    spill_stores_default_alloc: int | None = None


def _custom_calls(op, out: list) -> None:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if inner.operation.name == "stablehlo.custom_call":
                    out.append(inner.operation)
                _custom_calls(inner.operation, out)


def _bytecode_to_text(bytecode: bytes) -> str:
    """JAX's Triton dialect bytecode as text (the ``triton`` wheel reads the text
    form of JAX's IR; the two builds' bytecode encodings differ)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jaxlib.triton import dialect as tt_dialect

    ctx = mlir.make_ir_context()
    tt_dialect.register_dialect(ctx)
    with ctx:
        return ir.Module.parse(bytecode).operation.get_asm()


def capture(fn: Callable, *args) -> list[TritonKernel]:
    """Lower ``fn(*args)`` (arrays or ``jax.ShapeDtypeStruct``) for ``cuda`` and
    return the Triton kernels it launches, in program order."""
    from jax._src.lib.mlir import ir

    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    calls: list = []
    _custom_calls(lowered.compiler_ir("stablehlo").operation, calls)
    kernels = []
    for op in calls:
        if ir.StringAttr(op.attributes["call_target_name"]).value != _TARGET_CALL:
            continue
        cfg = ir.DictAttr(op.attributes["mhlo.backend_config"])
        kernels.append(TritonKernel(
            name=ir.StringAttr(cfg["name"]).value,
            ttir=_bytecode_to_text(ir.StringAttr(cfg["ir"]).value_bytes),
            num_warps=ir.IntegerAttr(cfg["num_warps"]).value,
            num_stages=ir.IntegerAttr(cfg["num_stages"]).value))
    return kernels


_REGS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, int]:
    """Registers, spills, stack and static shared memory from ``ptxas -v``."""
    regs = _REGS.search(log)
    spills = _SPILLS.search(log)
    if regs is None or spills is None:
        raise CompileCheckError(f"ptxas -v printed no resource report:\n{log}")
    smem = _SMEM.search(log)
    return dict(registers=int(regs.group(1)), stack_bytes=int(spills.group(1)),
                spill_stores=int(spills.group(2)), spill_loads=int(spills.group(3)),
                static_smem=int(smem.group(1)) if smem else 0)


@contextlib.contextmanager
def _stderr_to(path: str):
    """Send file descriptor 2 (C++ diagnostics) to ``path`` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def compile_kernel(kernel: TritonKernel, arch: str) -> KernelResources:
    """Compile ``kernel`` with ``triton`` for ``arch`` (a key of :data:`ARCHS`)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    limits = ARCHS[arch]
    with tempfile.TemporaryDirectory(prefix="pagedjax-ttir-") as tmp:
        src = os.path.join(tmp, f"{kernel.name}.ttir")
        with open(src, "w") as f:
            f.write(kernel.ttir)
        log_path = os.path.join(tmp, "compiler.log")
        report = io.StringIO()
        try:
            # MLIR prints its diagnostics on fd 2; with dump_ptxas_log, triton prints
            # the log of the very ptxas run that made its cubin.
            with _stderr_to(log_path), contextlib.redirect_stdout(report), \
                    knobs.nvidia.scope(), knobs.compilation.scope():
                knobs.nvidia.dump_ptxas_log = True
                knobs.compilation.always_compile = True  # a cache hit runs no ptxas
                out = triton.compile(src, target=GPUTarget("cuda", limits.cc, 32),
                                     options=dict(num_warps=kernel.num_warps,
                                                  enable_fp_fusion=True,
                                                  num_stages=kernel.num_stages))
        except Exception as e:  # noqa: BLE001 - any compiler failure is the finding
            with open(log_path, errors="replace") as f:
                diag = [ln for ln in f.read().splitlines() if "error" in ln.lower()][:5]
            raise CompileCheckError(f"{kernel.name} on {arch}: triton failed to compile: "
                                    f"{type(e).__name__}: {str(e)[:500]}; "
                                    + " | ".join(diag)) from e
    rep = parse_ptxas(report.getvalue())
    again = None
    if rep["spill_stores"] or rep["spill_loads"]:
        again = default_alloc_spills(out.asm["ptx"], limits)
    return KernelResources(arch=arch, name=kernel.name, num_warps=kernel.num_warps,
                           num_stages=kernel.num_stages, registers=rep["registers"],
                           spill_stores=rep["spill_stores"], spill_loads=rep["spill_loads"],
                           stack_bytes=rep["stack_bytes"],
                           shared_bytes=int(out.metadata.shared) + rep["static_smem"],
                           spill_stores_default_alloc=again)


def default_alloc_spills(ptx: str, limits: SmLimits) -> int:
    """Spill stores of ``ptx`` through triton's ptxas for ``limits`` with ptxas'
    default register allocator (triton adds ``--regAllocOptLevel=2``)."""
    import subprocess

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory(prefix="pagedjax-ptx-") as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([get_ptxas(limits.cc).path, "-v", f"--gpu-name={limits.name}",
                               src, "-o", src + ".o"], capture_output=True, text=True)
    if proc.returncode:
        raise CompileCheckError(f"ptxas (default allocator) failed: {proc.stderr[-500:]}")
    return parse_ptxas(proc.stderr)["spill_stores"]


def occupancy(res: KernelResources) -> dict[str, float]:
    """Blocks of the kernel resident on one SM, what limits them, and the
    resident warps as a fraction of the SM's maximum."""
    lim = ARCHS[res.arch]
    warp_regs = -(-res.registers * 32 // 256) * 256  # allocated per warp in 256s
    by = {
        "registers": (lim.regs_per_sm // warp_regs) // res.num_warps if warp_regs else 10**9,
        "shared": lim.smem_per_sm // (res.shared_bytes + lim.smem_reserved_per_block),
        "warps": lim.warps_per_sm // res.num_warps,
        "blocks": lim.blocks_per_sm,
    }
    limiter = min(by, key=by.get)
    blocks = by[limiter]
    return dict(blocks=blocks, limiter=limiter,
                occupancy=blocks * res.num_warps / lim.warps_per_sm)


def check(res: KernelResources, headroom_registers: int = 0) -> KernelResources:
    """Raise :class:`CompileCheckError` on any spill, shared memory past the
    SM's per-block limit, or (``headroom_registers``) fewer spare registers."""
    lim = ARCHS[res.arch]
    problems = []
    if res.spill_stores or res.spill_loads:
        alloc = ("" if res.spill_stores_default_alloc is None else
                 f"; {res.spill_stores_default_alloc} B with ptxas' default allocator")
        problems.append(f"spills {res.spill_stores} B stored, {res.spill_loads} B loaded "
                        f"({res.registers} registers{alloc})")
    if res.shared_bytes > lim.smem_per_block:
        problems.append(f"{res.shared_bytes} B of shared memory, more than the "
                        f"{lim.smem_per_block} B a block may use")
    if res.registers > lim.regs_per_thread - headroom_registers:
        problems.append(f"{res.registers} registers per thread, within {headroom_registers} "
                        f"of the limit {lim.regs_per_thread}")
    if problems:
        raise CompileCheckError(f"{res.name} on {res.arch}: " + "; ".join(problems))
    return res


def triton_unavailable() -> str | None:
    """None when this check can run here, else why not: no ``triton`` package, a
    JAX without the Pallas Triton lowering, or a ``triton`` that cannot read the
    Triton IR this JAX emits (probed on a one-line kernel)."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"the triton package is not installed ({e}); pip install -e '.[test]'"
    try:
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import triton as plgpu
    except Exception as e:  # noqa: BLE001
        return f"this JAX ({jax.__version__}) has no Pallas Triton lowering: {e}"

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    params = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")

    def fn(x):
        return pl.pallas_call(copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              compiler_params=params(num_warps=4, num_stages=1))(x)

    try:
        (kernel,) = capture(fn, jax.ShapeDtypeStruct((16, 16), jax.numpy.float32))
        compile_kernel(kernel, "sm_90a")
    except Exception as e:  # noqa: BLE001 - the reason is the finding
        return (f"triton {triton.__version__} cannot compile the Triton IR of JAX "
                f"{jax.__version__}: {str(e)[:300]}")
    return None
