"""Weights packed in one buffer (kernels_pallas/packed.py) and the block kernel reading them
in place.

* A view cut out of the buffer inside a trace equals the weight it was packed from,
  for every dtype the runner packs.
* The block kernel given the buffer and the components' byte offsets gives the same bits
  as given the components themselves (both layouts, Q4_1 and Q8_0 / Q6_K), and the
  compiled program then holds no slice: nothing is copied out of the buffer.
* A view that has been reshaped is no longer found (the kernel then reads the copy, same
  result); a packed buffer of the wrong dtype, or an offset past its end, is refused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.kernels_pallas import packed
from pagedjax.kernels_pallas.cpu import blockmatmul as cpu_block
from tests.kernels_pallas.test_cpu_blockmatmul import case

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the C++ kernel is for the CPU backend")


def host_buffer(arrays):
    entries, size = packed.layout(arrays)
    buf = np.zeros(size, np.uint8)
    for a, e in zip(arrays, entries):
        buf[e.offset:e.offset + e.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return buf, entries


def test_views_equal_what_was_packed():
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (3, 5), dtype=np.uint8),
              rng.standard_normal(7).astype(np.float32),
              rng.standard_normal((2, 3, 4)).astype(np.float16),
              rng.integers(-128, 128, (9,), dtype=np.int8),
              rng.integers(-5, 5, (4, 2), dtype=np.int32)]
    buf, entries = host_buffer(arrays)
    assert all(e.offset % packed.ALIGN == 0 for e in entries)

    def f(b):
        with packed.views(b, entries) as views:
            return views
    for a, v in zip(arrays, jax.jit(f)(jnp.asarray(buf))):
        assert v.dtype == a.dtype and v.shape == a.shape
        np.testing.assert_array_equal(np.asarray(v), a)


@pytest.mark.parametrize("kind,transposed", [("q4_1", False), ("q8_0", True), ("q6_k", True)])
def test_block_kernel_reads_the_buffer_in_place(kind, transposed):
    if not cpu_block.available():
        pytest.skip(f"the C++ block matmul is unavailable: {cpu_block.unavailable_reason()}")
    x, _, cols, rows = case(kind, 3, 512, 40)
    comps = rows if transposed else cols
    names = list(comps)
    filler = np.arange(100, dtype=np.float32)  # weights before and between the components
    buf, entries = host_buffer([filler] + [comps[c] for c in names])

    def packed_call(b, x):
        with packed.views(b, entries) as views:
            c = dict(zip(names, views[1:]))
            found = packed.sources(c)
            assert found is not None and found[1] == {n: e.offset for n, e in
                                                      zip(names, entries[1:])}
            return cpu_block.blockmatmul(kind, c, x, transposed=transposed, packed=found)

    f = jax.jit(packed_call)
    got = f(jnp.asarray(buf), x)
    want = jax.jit(lambda c, x: cpu_block.blockmatmul(kind, c, x, transposed=transposed))(
        {c: jnp.asarray(v) for c, v in comps.items()}, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    hlo = f.lower(jnp.asarray(buf), x).compile().as_text()
    assert " slice(" not in hlo and "copy(" not in hlo, "a component was copied out of the buffer"


def test_a_reshaped_view_is_not_found_and_bad_buffers_are_refused():
    if not cpu_block.available():
        pytest.skip(f"the C++ block matmul is unavailable: {cpu_block.unavailable_reason()}")
    x, _, cols, _ = case("q4_0", 2, 64, 24)
    names = list(cols)
    buf, entries = host_buffer([cols[c] for c in names])

    def f(b):
        with packed.views(b, entries) as views:
            c = dict(zip(names, views))
            assert packed.sources(c) is not None
            assert packed.sources({n: v.reshape(-1) for n, v in c.items()}) is None
            assert packed.sources({names[0]: c[names[0]], names[1]: c[names[1]] + 0}) is None
        assert packed.sources(c) is None  # the block has ended
        return b
    jax.jit(f)(jnp.asarray(buf))

    comps = {c: jnp.asarray(v) for c, v in cols.items()}
    with pytest.raises(ValueError, match="u8"):
        cpu_block.blockmatmul("q4_0", comps, x, packed=(jnp.zeros(8, jnp.float32),
                                                        {n: 0 for n in names}))
    past = {n: len(buf) - 8 for n in names}
    with pytest.raises(Exception, match="size does not match"):
        np.asarray(cpu_block.blockmatmul("q4_0", comps, x, packed=(jnp.asarray(buf), past)))
