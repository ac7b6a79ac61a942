"""kernels_pallas/cpu/zero_pages.py: zero-filled arrays made without writing
them are zeros, distinct buffers, and donatable in place (the KV pool's use)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.kernels_pallas.cpu import zero_pages

pytestmark = pytest.mark.skipif(not zero_pages.available(),
                                reason="needs the C++ build (a compiler, the CPU platform)")


def test_arrays_are_zero_and_distinct_even_over_reused_memory():
    specs = [((64, 2, 3, 16, 8), jnp.float32), ((33, 1000), jnp.bfloat16), ((5, 7), jnp.int8)]
    for _ in range(3):  # freed buffers full of ones come back from the allocator
        junk = [jnp.ones(s, d) for s, d in specs * 4]
        jax.block_until_ready(junk)
        del junk
        out = zero_pages.zeros(specs)
        for a, (shape, dtype) in zip(out, specs):
            assert a.shape == shape and a.dtype == jnp.dtype(dtype)
            np.testing.assert_array_equal(np.asarray(a, np.float32), 0)
    a, b = zero_pages.zeros([((1 << 20,), jnp.float32)] * 2)
    assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()


def test_a_pool_array_is_donated_in_place():
    (pool,) = zero_pages.zeros([((256, 1024), jnp.float32)])
    where = pool.unsafe_buffer_pointer()
    write = jax.jit(lambda p: p.at[3].set(2.0), donate_argnums=0)
    out = write(pool)
    assert pool.is_deleted() and out.unsafe_buffer_pointer() == where
    assert float(out[3].min()) == 2.0 and float(jnp.abs(out[4:]).max()) == 0.0


def test_kv_pages_made_with_it():
    from pagedjax.kernels_pallas import allocate_kv_pages

    pools = allocate_kv_pages(2, 8, 16, 2, 8, jnp.float32, zeros=zero_pages.zeros)
    assert len(pools) == 2 and pools[0][1] is None
    for pages, _ in pools:
        assert pages.shape == (8, 2, 2, 16, 8)
        np.testing.assert_array_equal(np.asarray(pages), 0)
