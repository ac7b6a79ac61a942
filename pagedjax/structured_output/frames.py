"""Frames between the server and its compile workers: 4-byte big-endian length + JSON."""

from __future__ import annotations

import json
import os
import struct


def read_frame(fd: int) -> bytes | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    return _read_exact(fd, struct.unpack(">I", head)[0])


def _read_exact(fd: int, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def write_frame(fd: int, obj) -> None:
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]
