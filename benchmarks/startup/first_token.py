"""Seconds from a fresh process's start to the default model's first token,
offline (``LLM()`` then ``generate``) and through the server (``pagedjax
serve``, polled until a 1-token completion answers), from an empty cache
(**cold**) and from the cache the cold run left (**warm**).

    python benchmarks/startup/first_token.py
    python benchmarks/startup/first_token.py --python before=/tmp/base/.venv/bin/python \\
        --python after=.venv/bin/python --rounds 2

Each ``--python`` names an interpreter whose ``pagedjax`` is measured; with
several, the runs alternate between them (round after round, each case with
every interpreter before the next case) so that a busy neighbour on a shared
machine weighs on all of them alike. Every run is a new process whose
``PAGEDJAX_CACHE`` (XLA's persistent compilation cache, the GGUF tokenizer)
is a fresh folder for the cold run and the same folder for the warm run that
follows it. The C++ kernel builds (``PAGEDJAX_CACHE_DIR``) are left where they
are (built once, by the first run if not before): this measures the compiled
XLA programs, the loading and the warm-up, not the C++ compiler. Prints a
table and writes JSON (``benchmarks/results/first_token.json``). Beside wall
seconds, the CPU seconds the process used until its first token (all its
threads): on a shared machine they move much less with a busy neighbour.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pagedjax.benchmarks import machine  # noqa: E402

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                            "first_token.json")
PROMPT = "The capital of France is"


# Offline: LLM() then a 1-token greedy generate. Run with ``python -c`` from the
# cache folder, so that the interpreter's own pagedjax is imported, never this
# checkout's.
# argv[1]: LLM(...) settings as JSON; argv[2]: "json" for a JSON-schema constrained
# first request (structured outputs), else a plain one.
CHILD = """
import json, sys, time
t0 = time.time()
from pagedjax import LLM, SamplingParams
from pagedjax.worker.plan import CompileCounter
CompileCounter.install()
t1 = time.time()
llm = LLM(**json.loads(sys.argv[1]))
t2 = time.time()
c, h = CompileCounter.count, CompileCounter.cache_hits
kw = {}
if sys.argv[2] == "json":
    from pagedjax.sampling_params import StructuredOutputsParams
    kw["structured_outputs"] = StructuredOutputsParams(json={"type": "object"})
llm.generate([%r], SamplingParams(temperature=0.0, max_tokens=1, **kw), use_tqdm=False)
t3 = time.time()
cpu = time.process_time()
n, m = CompileCounter.count - c, CompileCounter.cache_hits - h
print(json.dumps({"token_at": t3, "cpu_s": cpu, "import_s": t1 - t0, "llm_s": t2 - t1, "generate_s": t3 - t2,
                  "load": {"compiled": c - h, "read_back": h},
                  "generate": {"compiled": n - m, "read_back": m}}))
""" % PROMPT


def _env(cache: str) -> dict:
    env = dict(os.environ, PAGEDJAX_CACHE=cache)
    for k in ("PAGEDJAX_API_KEY", "VLLM_API_KEY", "PAGEDJAX_NATIVE_MATMUL_ROWS"):
        env.pop(k, None)
    return env


def offline(python: str, cache: str, timeout: float, engine_args: str = "{}",
            first: str = "plain") -> dict:
    start = time.time()
    r = subprocess.run([python, "-c", CHILD, engine_args, first], env=_env(cache), cwd=cache,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"offline run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["first_token_s"] = out.pop("token_at") - start
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(python: str, cache: str, timeout: float, engine_args: str = "{}",
           first: str = "plain") -> dict:
    if engine_args != "{}" or first != "plain":
        raise ValueError("--engine-args and --first apply to the offline case only")
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="first-token-server-", suffix=".log")
    start = time.time()
    proc = subprocess.Popen([python, "-m", "pagedjax.entrypoints.openai.api_server",
                             "--port", str(port), "--log-level", "info"], env=_env(cache),
                            cwd=cache, stdout=log, stderr=subprocess.STDOUT)
    body = json.dumps({"model": "SmolLM2-135M-Instruct", "prompt": PROMPT, "max_tokens": 1,
                       "temperature": 0.0}).encode()
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"server exited ({proc.returncode}):\n{log.read()[-3000:]}")
            if time.time() - start > timeout:
                raise RuntimeError(f"no completion after {timeout} s")
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)
        answered = time.time() - start
        cpu = _cpu_seconds(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.seek(0)
    phases = [ln.strip() for ln in log.read().splitlines()
              if any(f"{p}: " in ln for p in ("load", "compile", "ready"))]
    log.close()
    return {"first_token_s": answered, "cpu_s": cpu, "log": phases[:6]}


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process, all its threads (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def run(ns: argparse.Namespace) -> dict:
    pythons = dict(p.split("=", 1) if "=" in p else (p, p) for p in ns.python or
                   [f"this={sys.executable}"])
    results: dict = {label: {} for label in pythons}
    for rnd in range(ns.rounds):
        for case, fn in (("offline", offline), ("server", server)):
            if case not in ns.cases:
                continue
            for label, py in pythons.items():
                folder = tempfile.mkdtemp(prefix="pagedjax-first-token-")
                try:
                    for temp in ("cold", "warm"):
                        out = fn(py, folder, ns.timeout, ns.engine_args, ns.first)
                        out["loadavg"] = os.getloadavg()
                        results[label].setdefault(f"{case} {temp}", []).append(out)
                        print(f"round {rnd + 1} {label:>8} {case} {temp}: "
                              f"{out['first_token_s']:.1f} s wall, {out['cpu_s']:.1f} s CPU",
                              flush=True)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
    return {"pythons": pythons, "results": results}


def table(res: dict) -> str:
    labels = list(res["results"])
    cases = list(next(iter(res["results"].values())))
    head = "| case | " + " | ".join(f"{lb}: wall s, CPU s (median of runs)" for lb in labels) + " |"
    lines = [head, "|---|" + "---|" * len(labels)]
    for case in cases:
        cells = []
        for lb in labels:
            runs = res["results"][lb][case]
            wall = statistics.median(r["first_token_s"] for r in runs)
            cpu = statistics.median(r["cpu_s"] for r in runs)
            cells.append(f"{wall:.1f}, {cpu:.1f}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", metavar="LABEL=PATH",
                    help="an interpreter to measure (repeat to alternate several)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cases", default="offline,server")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--engine-args", default="{}",
                    help='offline only: LLM(...) settings as JSON, e.g. \'{"enable_lora": true}\' '
                         "or '{\"tensor_parallel_size\": 3}' (with XLA_FLAGS="
                         "--xla_force_host_platform_device_count=3 on the CPU)")
    ap.add_argument("--first", choices=("plain", "json"), default="plain",
                    help="offline only: the first request plain or JSON-schema constrained")
    ns = ap.parse_args(argv)
    json.loads(ns.engine_args)
    ns.cases = [c.strip() for c in ns.cases.split(",")]
    if not set(ns.cases) <= {"offline", "server"} or ns.rounds < 1:
        ap.error("--cases: offline and/or server; --rounds: at least 1")
    res = run(ns)
    print(table(res))
    print(machine.describe(machine.machine()))
    os.makedirs(os.path.dirname(os.path.abspath(ns.json)), exist_ok=True)
    with open(ns.json, "w") as f:
        json.dump({**res, "machine": machine.machine(), "argv": sys.argv[1:],
                   "xla_flags": os.environ.get("XLA_FLAGS", "")}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
