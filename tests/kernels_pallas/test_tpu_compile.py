"""The Mosaic kernel compiled by libtpu for TPU v5e and v6e, without a TPU.

libtpu (test extra) compiles for compile-only devices of a described slice
(kernels_pallas/pallas/tpu_compile.py). Every variant here is compiled under
80% of the VMEM limit the kernel asks for (the headroom check); an oversized
block proves the limit is enforced. The full matrix is
``benchmarks/kernel_bench/tpu_compile_check.py --kernels``.
"""

from __future__ import annotations

import functools

import pytest

from pagedjax.kernels_pallas.pallas import tpu_compile as tc


@functools.lru_cache(maxsize=None)
def _missing():
    return tc.libtpu_missing()


@pytest.fixture(autouse=True)
def _need_libtpu():
    reason = _missing()
    if reason:
        pytest.skip(f"libtpu cannot compile here: {reason}")


CASES = list(zip(tc.representative(), ("v5e", "v6e", "v6e", "v5e")))


@pytest.mark.parametrize("v,chip", CASES, ids=[f"{v.label}-{c}" for v, c in CASES])
def test_variant_compiles_within_80_percent_of_vmem(v, chip):
    compiled = tc.compile_variant(v, chip, vmem_limit_bytes=tc.HEADROOM_VMEM_LIMIT)
    mem = compiled.memory_analysis()
    assert mem.argument_size_in_bytes > 0
    assert "tpu_custom_call" in compiled.as_text()  # the Mosaic kernel, not a fallback


def test_oversized_block_fails_the_vmem_check():
    # 16 pages of [2, 8 heads, 512 tokens, 128] bf16 (2 MiB) per block, two slots: 64 MiB.
    big = tc.TpuVariant("decode", 128, 1, "bfloat16", 512, num_kv_heads=8, pages_per_seq=16,
                        pages_per_block=16)
    with pytest.raises(Exception, match="(?i)vmem|memory|exceed"):
        tc.compile_variant(big, "v5e", vmem_limit_bytes=tc.HEADROOM_VMEM_LIMIT)


def test_unknown_topology_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no device-less TPU target 'v99x:1x1'"):
        tc.tpu_devices("v99x:1x1")


def test_tpu_compiles_leave_the_persistent_cache_alone(tmp_path):
    """With a persistent cache folder set (as the engine sets one), compiles for a
    compile-only TPU neither write an entry nor try to read one back (which warns:
    such an executable cannot be deserialized without a client); outside them the
    cache is in use again."""
    import warnings

    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    saved = {n: getattr(jax.config, n) for n in names}
    try:
        for n, value in zip(names, (str(tmp_path), 0.0, 0)):
            jax.config.update(n, value)
        cc.reset_cache()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):  # the second compile would read the first one's entry
                tc.compile_variant(tc.TpuVariant("decode", 128, 4), "v5e")
        assert not [w for w in seen if "compilation cache" in str(w.message)]
        assert list(tmp_path.iterdir()) == []
        jax.jit(lambda x: x * 3.0 + 1.0)(2.0)
        assert len(list(tmp_path.iterdir())) == 1
    finally:
        for n, value in saved.items():
            jax.config.update(n, value)
        cc.reset_cache()
