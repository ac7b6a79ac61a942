"""llama.cpp's ``llama-server`` as the benchmarks' peer: where its binary and the
GGUF file are, its command line for a batch width, a running server (fresh
process, healthy, stopped afterwards) and its ``/completion`` endpoint.

Used by peer_serve.py (servers side by side), features/single_stream.py (one
stream's decode speed) and throughput/race.py (the offline race). The binary
is built from source (the llama-cpp-python sdist carries llama.cpp); pass
``--llama-server PATH`` or set ``LLAMA_SERVER``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import urllib.request
from typing import Iterator, Optional

from pagedjax.benchmarks.serve_server import free_port, start, stop

def find_server(explicit: Optional[str] = None) -> Optional[str]:
    """``explicit``, else ``$LLAMA_SERVER``, else ``llama-server`` on the PATH (None: none)."""
    path = explicit or os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    return path if path and os.path.isfile(path) else None


def gguf_path(model: Optional[str]) -> str:
    """The GGUF file both systems load: ``model`` when it names a .gguf file, else the
    file pagedjax resolves it to (None: the default model; an alias, a folder)."""
    if model and model.endswith(".gguf"):
        return model
    from pagedjax.models import resolve_model

    resolved = resolve_model(model)
    if not resolved.gguf_file:
        raise SystemExit(f"--model {model!r} is not a GGUF file; llama.cpp needs one")
    return os.path.join(resolved.path, resolved.gguf_file)


def add_args(p: argparse.ArgumentParser) -> None:
    """The options every comparison with llama-server takes: the binary, the GGUF
    file and its threads (default: every CPU this process may use, as XLA's pool)."""
    p.add_argument("--llama-server", default=None,
                   help="llama.cpp's llama-server binary (default: $LLAMA_SERVER, the PATH's)")
    p.add_argument("--model", default=None, help="GGUF file (default: the default model's)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="llama-server -t (default: the CPUs this process may use)")


def resolve_args(p: argparse.ArgumentParser, ns: argparse.Namespace, needed: bool) -> None:
    """``ns.llama_server`` found (an error when ``needed`` and missing) and ``ns.gguf``."""
    ns.llama_server = find_server(ns.llama_server)
    if needed and not ns.llama_server:
        p.error("llama-server not found: pass --llama-server PATH (or set LLAMA_SERVER)")
    ns.gguf = gguf_path(ns.model)


def command(server: str, gguf: str, port: int, *, slots: int, ctx: int, threads: int,
            alias: Optional[str] = None, extra: tuple[str, ...] = ()) -> list[str]:
    """``llama-server`` with ``slots`` parallel sequences of ``ctx`` tokens each
    (``-c slots*ctx -np slots -cb``) on ``threads`` threads."""
    cmd = [server, "-m", gguf, "-c", str(ctx * slots), "-np", str(slots), "-cb",
           "-t", str(threads), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    if alias:
        cmd += ["--alias", alias]
    return cmd + list(extra)


@contextlib.contextmanager
def running(server: str, gguf: str, *, slots: int, ctx: int, threads: int,
            timeout: float = 600.0, log_path: Optional[str] = None,
            extra: tuple[str, ...] = ()) -> Iterator[str]:
    """A fresh ``llama-server`` (see ``command``), healthy; yields its base URL and
    stops it on exit."""
    port = free_port()
    proc = start(command(server, gguf, port, slots=slots, ctx=ctx, threads=threads,
                         extra=extra), f"http://127.0.0.1:{port}", timeout, log_path)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def completion(url: str, prompt, n_predict: int, timeout: float = 3600.0) -> dict:
    """One greedy ``/completion`` of exactly ``n_predict`` tokens (EOS ignored, no
    prompt cache); ``prompt`` is text or a list of token ids. -> the server's answer
    (``tokens_predicted``, ``timings``: its own counts and rates; ``tokens``: the
    generated token ids, for the greedy agreement)."""
    body = {"prompt": prompt, "n_predict": int(n_predict), "temperature": 0.0, "top_k": 1,
            "ignore_eos": True, "cache_prompt": False, "return_tokens": True}
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def gguf_tensor_bytes(gguf: str) -> int:
    """The file's tensor bytes: what llama.cpp maps as its weights."""
    from pagedjax.models.loader import gguf_reader

    return sum(int(t.n_bytes) for t in gguf_reader(gguf).tensors)
