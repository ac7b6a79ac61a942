"""models/gguf_dequant.py against the ``gguf`` package's own dequantizer: the
whole-tensor numpy passes give bit-identical float32 weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from pagedjax.models import gguf_dequant
from pagedjax.models.gguf_file import GGUFFile


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 96)])
def test_matches_gguf_bit_for_bit(qtype, shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 4, shape[:-1] + (1,))).astype(np.float32)
    x[..., :7] = 0.0  # a block's zeros and tiny scales
    t = gguf.GGMLQuantizationType[qtype]
    packed = gguf.quants.quantize(x, t)
    want = gguf.quants.dequantize(packed, t)
    got = gguf_dequant.dequantize(packed, t)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, x, atol=np.abs(x).max() * 0.2)  # and it is the tensor


def test_other_types_go_to_gguf():
    x = np.linspace(-2, 2, 2 * 256, dtype=np.float32).reshape(2, 256)
    t = gguf.GGMLQuantizationType.F16
    packed = gguf.quants.quantize(x, t)
    np.testing.assert_array_equal(gguf_dequant.dequantize(packed, t),
                                  gguf.quants.dequantize(packed, t))


def test_the_default_models_tensors(smollm2_gguf):
    f = GGUFFile(smollm2_gguf)
    seen = set()
    for t in f.tensors:
        name = gguf.GGMLQuantizationType(t.tensor_type).name
        if name in seen or name == "F32":
            continue
        seen.add(name)
        data = f.tensor_data(t)
        np.testing.assert_array_equal(gguf_dequant.dequantize(data, t.tensor_type),
                                      gguf.quants.dequantize(data, t.tensor_type))
    assert {"Q4_1", "Q8_0"} <= seen
