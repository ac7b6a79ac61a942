"""The suite's soak: benchmarks/serving/soak.py for 30 s against the shared real server.

128 streaming clients, completions and chat with mixed parameters, 15% walking
away mid-stream. Nothing may fail or hang, and once the server is idle no KV
page may be held. (The 10-minute run and its RSS figures are in BENCHMARKS.md#server-soak.)
"""

from __future__ import annotations

import os
import sys

import pytest
from tests.utils.paths import REPO, REPO_ROOT  # noqa: F401

pytestmark = pytest.mark.slow

sys.path.insert(0, os.path.join(REPO, "benchmarks", "serving"))  # soak.py, soak_hostile.py


def test_soak_30s(server):
    import soak

    s = soak.soak(server.url, server.proc.pid, server.api_key, clients=128, duration=30.0,
                  max_requests=2000, timeout=600.0, seed=1)
    soak.print_table(s)
    assert s["failed"] == 0 and s["hung"] == 0, s["errors"]
    assert s["completed"] >= 32 and s["disconnected"] >= 1, s
    assert s["pages_held_at_end"] == 0
    assert server.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 200
