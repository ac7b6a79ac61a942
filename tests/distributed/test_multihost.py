"""Multi-host tensor parallelism on one machine: two CPU processes, jax.distributed.

``pagedjax serve --tensor-parallel-size 2 --coordinator-address ... --num-processes 2
--process-id {0,1}``: each process has ONE CPU device, so the TP=2 mesh spans both
processes and every step's collectives cross the process boundary (gloo). Process
0 serves HTTP; process 1 follows its engine. The greedy tokens must equal a
single-process TP=1 run of the same model, and both processes must exit cleanly
when the leader stops.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

from tests.distributed.test_parallel import PROMPTS, ROOT, run_isolated

MAX_TOKENS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _wait_healthy(url: str, procs, logs, deadline: float) -> None:
    while time.time() < deadline:
        for p, log in zip(procs, logs):
            if p.poll() is not None:
                raise AssertionError(f"a process exited early (rc {p.returncode}):\n"
                                     f"{open(log).read()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError("the leader did not become healthy:\n" + open(logs[0]).read()[-4000:])


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder("llama")


from tests.distributed.test_parallel import tiny_folder  # noqa: E402,F401  (fixture)


def test_two_process_tp2_server_matches_single_process(folder, tmp_path):
    ref = run_isolated({"kind": "generate", "model": folder, "tps": [1],
                        "max_tokens": MAX_TOKENS}, num_devices=1)["1"]["tokens"]

    port, coord = _free_port(), _free_port()
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PAGEDJAX_CACHE"] = env.get("PAGEDJAX_CACHE") or tempfile.mkdtemp()
    common = [sys.executable, "-m", "pagedjax.entrypoints.cli", "serve", folder,
              "--port", str(port), "--tensor-parallel-size", "2", "--dtype", "float32",
              "--page-size", "4", "--max-model-len", "64", "--max-num-seqs", "4",
              "--num-pages", "64", "--log-level", "warning",
              "--coordinator-address", f"127.0.0.1:{coord}", "--num-processes", "2"]
    procs, logs = [], []
    try:
        for pid in (0, 1):
            log = str(tmp_path / f"proc{pid}.log")
            logs.append(log)
            procs.append(subprocess.Popen(common + ["--process-id", str(pid)], cwd=ROOT, env=env,
                                          stdout=open(log, "w"), stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, procs, logs, time.time() + 300)

        # Concurrent requests: they share steps, so the batch composition crosses hosts too.
        got: dict[int, list[int]] = {}

        def ask(i):
            out = _post(url + "/v1/completions", {
                "model": folder, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS,
                "temperature": 0.0, "ignore_eos": True})
            got[i] = [int(t) for t in re.findall(r"w(\d+)", out["choices"][0]["text"])]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert [got.get(i) for i in range(len(PROMPTS))] == ref

        procs[0].send_signal(signal.SIGINT)  # leader stops -> tells the follower to stop
        rcs = [p.wait(60) for p in procs]
        follower_log = open(logs[1]).read()
        assert rcs == [0, 0], f"exit codes {rcs}:\n{follower_log[-3000:]}"
        m = re.search(r"follower ran (\d+) steps", follower_log)
        assert m and int(m.group(1)) >= MAX_TOKENS, follower_log[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
