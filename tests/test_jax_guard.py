"""The JAX version guard of kernels_pallas: without the Pallas Triton lowering
(deprecated in JAX 0.11), `auto` on a GPU falls back to `xla` with one warning
and an explicit `pallas_gpu` is a clear error. The missing lowering and the GPU
platform are simulated; the real import check runs too."""

from __future__ import annotations

import warnings

import pytest

import pagedjax.kernels_pallas as kernels_pallas


def test_this_jax_has_the_triton_lowering():
    # The pinned range (pyproject) includes it: the check itself must say so.
    assert kernels_pallas.triton_lowering_missing() is None


def test_missing_lowering(monkeypatch):
    msg = "this JAX (9.9) has no Pallas Triton lowering"
    monkeypatch.setattr(kernels_pallas, "triton_lowering_missing", lambda: msg)
    with pytest.raises(ValueError, match="attention_backend='pallas_gpu': this JAX"):
        kernels_pallas.resolve_backend("pallas_gpu")
    monkeypatch.setattr(kernels_pallas.jax, "default_backend", lambda: "gpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert kernels_pallas.resolve_backend("auto") == "xla"
    assert len(seen) == 1 and "falls back to the 'xla' backend" in str(seen[0].message)
    assert kernels_pallas.resolve_backend("pallas_tpu") == "pallas_tpu"  # Mosaic is unaffected
