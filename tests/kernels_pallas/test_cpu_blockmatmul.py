"""The C++ GGUF block-weight matmul (kernels_pallas/cpu/blockmatmul.cc).

* For Q8_0, Q4_0, Q4_1, Q4_K and Q6_K blocks, ``x @ W`` (a Linear kernel, the
  blocks along K) and ``x @ W.T`` (the tied LM head) match
  ``gguf.quants.dequantize`` + a float64 matmul within
  ``TOL * sum_k |x_k w_k|`` (float32 accumulation over K terms; TOL = 2e-6) on
  odd shapes: N past the 16-column strips and the 4-row groups, 1-13 rows (the
  register tile's groups of 6 and their remainder). Blocks are random bytes written in GGUF's own block layout (scales
  set to finite float16), repacked by the loader's ``repack_gguf``.
* Every build path (this CPU's full set, AVX2 + FMA, portable) passes
  its self-test and the same comparison; paths this machine cannot run are
  skipped, naming why. A row's bits do not depend on the rest of its batch.
* Bad arguments raise ValueError naming what to change.
"""

from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from pagedjax.kernels_pallas.cpu import blockmatmul as cpu_block, build as cpu_build
from pagedjax.models import quant as Q
from tests.kernels_pallas.test_cpu_native import _flag_id, build_path

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the C++ kernel is for the CPU backend")

TOL = 2e-6
# kind -> (GGUF type, bytes a block, block size, byte offsets of its float16 fields)
GGUF = {
    "q8_0": (T.Q8_0, 34, 32, (0,)),
    "q4_0": (T.Q4_0, 18, 32, (0,)),
    "q4_1": (T.Q4_1, 20, 32, (0, 2)),
    "q4_k": (T.Q4_K, 144, 256, (0, 2)),
    "q6_k": (T.Q6_K, 210, 256, (208,)),
}
KINDS = tuple(GGUF)

bmm = jax.jit(cpu_block.blockmatmul, static_argnames=("kind", "transposed", "target"))


def gguf_rows(kind: str, rows: int, k: int, seed: int) -> np.ndarray:
    """u8[rows, bytes]: random GGUF blocks of ``kind`` for ``rows`` rows of ``k`` values,
    each float16 field a finite value of either sign (some subnormal)."""
    _, size, block, f16_at = GGUF[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, k // block, size), dtype=np.uint8)
    for off in f16_at:
        h = rng.uniform(0.002, 0.05, (rows, k // block)).astype(np.float16)
        h[rng.random(h.shape) < 0.05] = np.float16(3e-6)  # a subnormal scale
        h *= np.where(rng.random(h.shape) < 0.3, -1, 1).astype(np.float16)
        raw[..., off:off + 2] = h[..., None].view(np.uint8).reshape(rows, k // block, 2)
    return raw.reshape(rows, -1)


def case(kind, m, k, n, seed=0):
    """x [m, k]; the weight's GGUF rows [n, k] dequantized by gguf (float64 reference
    [k, n]); our components in the Cols layout [K_c, n] and the Rows layout [n, K_c]."""
    raw = gguf_rows(kind, n, k, seed)
    w = gguf_dequantize(raw, GGUF[kind][0]).astype(np.float64)  # [n, k]
    rows = Q.repack_gguf(kind, raw, k)
    cols = {c: np.ascontiguousarray(v.T) for c, v in rows.items()}
    x = np.random.default_rng(seed + 1).standard_normal((m, k)).astype(np.float32)
    return x, w.T, cols, rows


def assert_close(out, x, w):
    """out ~ x @ w within TOL * sum_k |x_k w_k| (w float64 [k, n])."""
    xd = x.astype(np.float64)
    ref, mag = xd @ w, np.abs(xd) @ np.abs(w)
    err = np.abs(np.asarray(out, np.float64) - ref)
    assert out.shape == ref.shape and np.all(err <= TOL * mag + 1e-30), \
        f"max |diff| / bound {np.max(err / (TOL * mag + 1e-30)):.3g}"


def int4_case(group, m, k, n, seed):
    """AWQ / GPTQ groups as int4_g<group> components: nibble values, f32 scales of
    either sign, zero points 0..16 (GPTQ's +1 convention reaches 16); the reference
    ``s * (q - z)`` in float64, written here from the formula."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    s = (rng.uniform(0.002, 0.05, (n, k // group))
         * np.where(rng.random((n, k // group)) < 0.3, -1, 1)).astype(np.float32)
    z = rng.integers(0, 17, (n, k // group)).astype(np.uint8)
    w = s.astype(np.float64).repeat(group, 1) * (q.astype(np.float64) - z.repeat(group, 1))
    b = q.reshape(n, k // 32, 2, 16)
    rows = {"qs": (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(n, k // 2), "s": s, "z": z}
    cols = {c: np.ascontiguousarray(v.T) for c, v in rows.items()}
    x = rng.standard_normal((m, k)).astype(np.float32)
    return x, w.T, cols, rows


def run_int4(fn, group, m, k, n, seed):
    x, w, cols, rows = int4_case(group, m, k, n, seed)
    kind = f"int4_g{group}"
    assert_close(fn(kind, cols, x, False), x, w)
    assert_close(fn(kind, rows, x, True), x, w)


def run_both(fn, kind, m, k, n, seed):
    x, w, cols, rows = case(kind, m, k, n, seed)
    assert_close(fn(kind, cols, x, False), x, w)
    assert_close(fn(kind, rows, x, True), x, w)


def _jit_call(kind, comps, x, transposed):
    comps = {c: jnp.asarray(v) for c, v in comps.items()}
    return np.asarray(bmm(kind, comps, jnp.asarray(x), transposed=transposed))


def test_builds_here():
    assert cpu_block.available(), cpu_block.unavailable_reason()
    assert cpu_build.build_info("cpu_blockmatmul")["so"].endswith(".so")
    if platform.machine() in ("x86_64", "AMD64"):
        assert cpu_block.fast()


@pytest.mark.parametrize("kind", KINDS)
def test_matches_gguf_dequantize_float64(kind):
    block = GGUF[kind][2]
    for m, k, n in [(1, 2 * block, 37), (5, block, 16), (13, 3 * block, 45), (4, 2 * block, 3)]:
        run_both(_jit_call, kind, m, k, n, seed=m + n)


@pytest.mark.parametrize("kind", ["q8_0", "q6_k"])
def test_long_k_matches_gguf_dequantize_float64(kind):
    """K past the panels' whole-strip limit (kFullK, 2048): chunks of K at a time."""
    run_both(_jit_call, kind, 9, 2304, 40, seed=5)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_groups_match_numpy_float64(group):
    """AWQ / GPTQ int4 groups (models/checkpoint_quant.py's repacking) in the block kernel."""
    for m, k, n in [(1, 2 * group, 37), (5, group, 16), (13, 3 * group, 45), (4, 256, 3)]:
        if k % group == 0:
            run_int4(_jit_call, group, m, k, n, seed=m + n)


def _path_call(flags):
    """x @ W through the kernel built with exactly ``flags`` (blockmatmul.build_target),
    or skip naming why that build cannot run here."""
    try:
        target = cpu_block.build_target(flags)
    except RuntimeError as e:
        pytest.skip(f"path {_flag_id(flags)!r} cannot run on this machine: {str(e)[-300:]}")

    def run(kind, comps, x, transposed):
        comps = {c: jnp.asarray(v) for c, v in comps.items()}
        return np.asarray(bmm(kind, comps, jnp.asarray(x), transposed=transposed, target=target))
    return run


@pytest.mark.parametrize("flags", cpu_build.default_flag_sets(), ids=_flag_id)
def test_every_build_path_matches_gguf(flags):
    """Each instruction-set path passes its self-test (in a child process when the
    builder built it, and here) and matches gguf's dequantization in float64."""
    assert build_path(cpu_block.SOURCE, "cpu_blockmatmul", flags).PagedjaxSelfTest() == 0
    run = _path_call(flags)
    for kind in KINDS:
        block = GGUF[kind][2]
        run_both(run, kind, 7, 2 * block, 37, seed=3)
    for group in (32, 128):
        run_int4(run, group, 7, 256, 37, seed=3)


# The row counts at which the kernel may change path, by layout (transposed):
# blockmatmul.cc's kChunkRows (W [K, N] read in place up to 8 rows) and, for the tied
# table, kRowsFewMax with AVX-512 (read in place up to 4 rows, dots of widened rows up
# to kDotRows = 16; AVX2 reads 1-16 in place, a case the finer split still checks);
# both run on panels past that.
PATH_ENDS = {False: (8,), True: (4, 16)}


@pytest.mark.parametrize("flags", cpu_build.default_flag_sets(), ids=_flag_id)
def test_row_results_do_not_depend_on_the_batch(flags):
    """Every build path, both layouts: a row's bits are the same at every row count
    within each of the kernel's paths: a few rows (AVX2: the blocks read in place
    with the scales factored out of the sums), the tied table's dots of widened rows
    (5-16 rows), and more (panels through the register tiles; plain loops without
    AVX2). Each gives gguf's product to the same tolerance."""
    run = _path_call(flags)
    for kind in ("q8_0", "q4_0", "q4_1", "q6_k"):
        x, w, cols, rows = case(kind, 22, 512, 40, seed=9)
        for comps, t in ((cols, False), (rows, True)):
            first = 1
            for last in PATH_ENDS[t] + (len(x),):
                whole = run(kind, comps, x[:last], t)
                for r in sorted({first, first + 1, (first + last) // 2, last - 1} - {0}):
                    if first <= r < last:
                        np.testing.assert_array_equal(run(kind, comps, x[:r], t), whole[:r])
                assert_close(whole, x[:last], w)
                first = last + 1


def test_bad_arguments_name_what_to_change():
    x, _, cols, _ = case("q4_1", 2, 64, 16)
    with pytest.raises(ValueError, match="int4_g<G>"):
        cpu_block.blockmatmul("int4_g48", cols, jnp.asarray(x))
    with pytest.raises(ValueError, match="kind 'q5_0'"):
        cpu_block.blockmatmul("q5_0", cols, jnp.asarray(x))
    with pytest.raises(ValueError, match="components"):
        cpu_block.blockmatmul("q4_1", {"qs": cols["qs"]}, jnp.asarray(x))
    with pytest.raises(ValueError, match="float32"):
        cpu_block.blockmatmul("q4_1", cols, jnp.asarray(x, jnp.bfloat16))
    with pytest.raises(ValueError, match="component qs of shape"):
        cpu_block.blockmatmul("q4_1", cols, jnp.asarray(x[:, :32]))


def test_live_rows_leave_out_the_padding():
    """``live_rows`` (a traced count): the leading rows are the bits of the full product
    at that row count, the rest zeros; a count outside [0, M] computes every row. Both
    layouts, across the kernel's paths (few rows, the head's dots, panels)."""
    x, w, cols, rows = case("q4_1", 32, 256, 40, seed=5)
    f = jax.jit(lambda comps, x, n, t: bmm("q4_1", comps, x, transposed=t, live_rows=n),
                static_argnums=3)
    for comps, t in ((cols, False), (rows, True)):
        comps = {c: jnp.asarray(v) for c, v in comps.items()}
        full = np.asarray(bmm("q4_1", comps, jnp.asarray(x), transposed=t))
        for n in (0, 1, 5, 9, 17, 31, 32, 40, -1):
            out = np.asarray(f(comps, jnp.asarray(x), jnp.int32(n), t))
            live = n if 0 <= n < 32 else 32
            np.testing.assert_array_equal(
                out[:live], np.asarray(bmm("q4_1", comps, jnp.asarray(x[:live]), transposed=t))
                if live else out[:0])
            assert not out[live:].any(), (t, n)
            if live == 32:
                np.testing.assert_array_equal(out, full)
