"""A GGUF file's header: its key/value metadata and its tensors' names, types,
shapes and places in the file, read with ``struct`` from a memory map.

``gguf.GGUFReader`` builds a numpy view per value of every metadata array (a
default model's 49k vocabulary strings and 49k merges: about 800k memmap
slices) and takes seconds per start; this reads the same header in tens of
milliseconds. A tensor's data is a numpy view of the memory-mapped file, made
when asked for, in ``GGUFReader``'s layout (float and integer types as their
numpy dtype in row-major ``reversed(shape)``; quantized types as ``uint8``
rows of packed blocks), so ``gguf.quants.dequantize`` reads it as it reads
``GGUFReader``'s. Little-endian GGUF v2 and v3.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct

import numpy as np

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
            10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# GGML types stored as plain numpy arrays; every other type is packed blocks.
_PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32,
          27: np.int64, 28: np.float64}
DEFAULT_ALIGNMENT = 32


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    """One tensor's entry: ``shape`` in GGML order (innermost first, as
    ``GGUFReader``'s), ``tensor_type`` the GGML type id."""

    name: str
    tensor_type: int
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    _file: "GGUFFile" = dataclasses.field(repr=False, compare=False)

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes in the file, as ``GGUFReader`` lays them out (no copy)."""
        return self._file.tensor_data(self)


class _Cursor:
    """Reads GGUF values from a buffer, front to back."""

    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str):
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return out

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<IQ")
            if etype in _SCALARS:
                return list(self.unpack(f"<{count}{_SCALARS[etype]}"))
            return [self.value(etype) for _ in range(count)]
        if vtype not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {vtype}")
        return self.unpack("<" + _SCALARS[vtype])[0]


class GGUFFile:
    """The header of the GGUF file at ``path``: ``metadata`` (key -> Python
    value: int, float, bool, str or list) and ``tensors`` (in file order)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise ValueError(f"{self.path}: not a GGUF file")
            cur = _Cursor(buf, self.path)
            cur.pos = 4
            version, n_tensors, n_kv = cur.unpack("<IQQ")
            if version not in (2, 3):
                raise ValueError(f"{self.path}: GGUF version {version} is not supported "
                                 "(v2/v3 little-endian)")
            self.metadata: dict = {}
            for _ in range(n_kv):
                key = cur.string()
                self.metadata[key] = cur.value(cur.unpack("<I")[0])
            infos = []
            for _ in range(n_tensors):
                name = cur.string()
                (n_dims,) = cur.unpack("<I")
                dims = cur.unpack(f"<{n_dims}Q")
                ttype, offset = cur.unpack("<IQ")
                infos.append((name, ttype, dims, offset))
            align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
            if align <= 0 or align & (align - 1):
                raise ValueError(f"{self.path}: general.alignment={align} is not a power of two")
            start = -(-cur.pos // align) * align
        self.tensors = [self._tensor(name, ttype, dims, start + offset)
                        for name, ttype, dims, offset in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError(f"{self.path}: duplicated tensor names")
        self._memmap = None

    def _tensor(self, name: str, ttype: int, dims: tuple, offset: int) -> GGUFTensor:
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if ttype in _PLAIN:
            n_bytes = n * np.dtype(_PLAIN[ttype]).itemsize
        else:
            block, size = _quant_sizes(ttype, self.path, name)
            n_bytes = n * size // block
        return GGUFTensor(name, ttype, tuple(int(d) for d in dims), n, n_bytes, offset, self)

    def tensor_data(self, t: GGUFTensor) -> np.ndarray:
        if self._memmap is None:
            self._memmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._memmap[t.data_offset:t.data_offset + t.n_bytes]
        shape = tuple(reversed(t.shape))
        if t.tensor_type in _PLAIN:
            return raw.view(_PLAIN[t.tensor_type]).reshape(shape)
        block, size = _quant_sizes(t.tensor_type, self.path, t.name)
        return raw.reshape(*shape[:-1], shape[-1] // block * size)


def _quant_sizes(ttype: int, path: str, name: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a packed GGML type."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise ValueError(f"{path}: tensor {name!r} has an unknown GGML type {ttype}") from None
