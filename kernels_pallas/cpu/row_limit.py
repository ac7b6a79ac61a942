"""The measure-once-and-cache logic the C++ kernels' row limits share
(matmul_rows.py: the float32 few-row matmul; quant_rows.py: the int8 and block
kernels): an environment variable sets the limit, else a JSON file cached beside
the kernel's build holds it, else it is measured, chosen and written there
atomically (concurrent processes each write a whole file)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable


def env_rows(name: str, what: str) -> int | None:
    """``$name`` as a non-negative row count, None when unset; ValueError naming it
    otherwise (``what``: the kernel, for the message)."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        rows = int(v)
    except ValueError:
        rows = -1
    if rows < 0:
        raise ValueError(f"{name}={v!r}: expected a non-negative integer (the most rows a "
                         f"step may have to run its {what} in the C++ kernel; 0: never)")
    return rows


def is_rows(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def read_json(path: Path, fmt: int) -> dict | None:
    """The cached object when it is readable and of format ``fmt``, else None."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == fmt else None


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` atomically (a temporary file renamed over ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def cached(path: Path, read: Callable, measure: Callable, choose: Callable, write: Callable):
    """``read(path)``, else ``choose(measure())`` written by ``write(path, choice,
    timings)`` (a read-only cache: measured again by the next process)."""
    got = read(path)
    if got is not None:
        return got
    timings = measure()
    choice = choose(timings)
    try:
        write(path, choice, timings)
    except OSError:
        pass
    return choice
