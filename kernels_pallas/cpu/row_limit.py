"""The measure-once-and-cache logic the C++ kernels' row limits share
(matmul_rows.py: the float32 few-row matmul; quant_rows.py: the int8 and block
kernels): an environment variable sets the limit, else a JSON file cached beside
the kernel's build holds it, else it is measured, chosen and written there
atomically (concurrent processes each write a whole file). A choice measured on a
busy machine (other jobs' threads in its timings) holds only while the machine
stays busy: the first process that starts on a quieter one measures again."""

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


# The 1-minute load average a core from which the machine counts as busy: more
# runnable threads than cores by half, so timings taken then share the cores.
BUSY_LOAD_PER_CPU = 1.5


def load_average() -> float:
    """The 1-minute load average (0.0 where the OS gives none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def is_busy(load: float) -> bool:
    return load >= BUSY_LOAD_PER_CPU * (os.cpu_count() or 1)


def measured_busy(path: Path) -> bool:
    """Whether the cached file says it was measured on a busy machine."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("measured_busy") is True


def cached(path: Path, read: Callable, measure: Callable, choose: Callable, write: Callable):
    """``read(path)``, else ``choose(measure())`` written by ``write(path, choice,
    timings, load)`` (``load``: {"load_average", "measured_busy"}, kept in the file; a
    read-only cache: measured again by the next process). A cached choice measured
    while the machine was busy is measured again (and replaced) once it is not."""
    load = load_average()
    got = read(path)
    if got is not None and not (measured_busy(path) and not is_busy(load)):
        return got
    timings = measure()
    choice = choose(timings)
    try:
        write(path, choice, timings, {"load_average": round(load, 2),
                                      "measured_busy": is_busy(load)})
    except OSError:
        pass
    return choice
