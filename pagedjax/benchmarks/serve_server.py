"""Servers that ``pagedjax bench serve --start-server`` (and repository scripts that
compare servers) start and stop: any command line, healthy once ``GET /health``
answers 200, stopped with SIGTERM (then SIGKILL)."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pagedjax_command(port: int, server_args: str = "") -> list[str]:
    """``pagedjax serve`` (its module) on ``port`` with extra options (one string)."""
    return [sys.executable, "-m", "pagedjax.entrypoints.openai.api_server", "--port", str(port),
            *shlex.split(server_args or "")]


def start(cmd: list[str], url: str, timeout: float = 900.0,
          log_path: Optional[str] = None) -> subprocess.Popen:
    """Start ``cmd`` and wait until ``url``/health answers 200 (RuntimeError if it
    exits or takes longer than ``timeout`` seconds; its output goes to ``log_path``)."""
    log = open(log_path, "w") if log_path else None
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None)
    if log:
        log.close()
    where = f"; see {log_path}" if log_path else ""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}{where}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"{cmd[0]} not healthy in {timeout:.0f} s{where}")


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
