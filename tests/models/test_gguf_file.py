"""The GGUF header reader against gguf's own GGUFReader, on a file gguf's
GGUFWriter wrote: every metadata value, every tensor's type, shape, size,
offset and bytes, for float, integer and packed (quantized) types."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from pagedjax.models.gguf_file import GGUFFile  # noqa: E402

Q = gguf.GGMLQuantizationType


def _write(path, alignment=None):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_bool("some.flag", True)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "é", "<s>", "ab c"])
    w.add_token_scores([0.5, -1.0, 2.0, 0.0, 1.0])
    w.add_token_types([1, 1, 1, 3, 1])
    w.add_token_merges(["a b", "ab c"])
    w.add_array("some.ints", [1, -2, 3])
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((4, 8)).astype(np.float16))
    w.add_tensor("i32", np.arange(7, dtype=np.int32))
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), Q.Q8_0)
    w.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=Q.Q8_0)
    q41 = gguf.quants.quantize(rng.standard_normal((3, 32)).astype(np.float32), Q.Q4_1)
    w.add_tensor("q41", q41, raw_shape=q41.shape, raw_dtype=Q.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_header_matches_gguf_reader(tmp_path, alignment):
    path = tmp_path / "t.gguf"
    _write(path, alignment)
    ours, ref = GGUFFile(path), gguf.GGUFReader(str(path))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        if isinstance(want, list) and want and isinstance(want[0], float):
            np.testing.assert_allclose(got, want)
        elif isinstance(want, float):
            assert got == pytest.approx(want)
        else:
            assert got == want, key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.tensor_type == int(b.tensor_type)
        assert a.shape == tuple(int(d) for d in b.shape)
        assert (a.n_elements, a.n_bytes, a.data_offset) == (b.n_elements, b.n_bytes, b.data_offset)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        np.testing.assert_array_equal(a.data, b.data)
    q = next(t for t in ours.tensors if t.name == "q41")
    np.testing.assert_array_equal(gguf.quants.dequantize(q.data, Q.Q4_1),
                                  gguf.quants.dequantize(ref.tensors[4].data, Q.Q4_1))


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(path)


def test_unsupported_version(tmp_path):
    path = tmp_path / "v9.gguf"
    path.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ValueError, match="version 9"):
        GGUFFile(path)
