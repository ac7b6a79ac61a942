"""The benchmark scripts run as ``python benchmarks/<kind>/<name>.py``, which puts
their folder first on ``sys.path``: a script named like an installed module
shadows it for every import in that process. (``benchmarks/kernel_bench.py`` did:
transformers 5.25 imports the ``kernels`` package, so every benchmark that
loaded transformers failed with ``cannot import name 'CUDAProperties'``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.utils.paths import REPO

BENCH = os.path.join(REPO, "benchmarks")
FOLDERS = sorted(os.path.join(BENCH, d) for d in os.listdir(BENCH)
                 if os.path.isdir(os.path.join(BENCH, d)) and not d.startswith((".", "_"))
                 and d != "results")


def test_no_benchmark_script_shadows_an_installed_module():
    # Asked in a child whose sys.path lacks benchmarks/ and the repository root
    # (as any other program of this environment would see it).
    # A folder's name counts too: a script or test that puts benchmarks/ on sys.path
    # (to import one of them) makes each folder an importable package.
    names = sorted({f[:-3] for d in FOLDERS for f in os.listdir(d)
                    if f.endswith(".py") and f != "__init__.py"}
                   | {os.path.basename(d) for d in FOLDERS})
    code = ("import importlib.util, json, sys\n"
            "names = json.loads(sys.argv[1])\n"
            "print(json.dumps([n for n in names if n in sys.stdlib_module_names\n"
            "                  or importlib.util.find_spec(n) is not None]))\n")
    out = subprocess.run([sys.executable, "-I", "-c", code, json.dumps(names)], cwd="/",
                         capture_output=True, text=True, check=True)
    clashes = json.loads(out.stdout)
    assert clashes == [], f"benchmarks/*/{clashes[0]}.py shadows an installed module: rename it"
    assert "cold_start" in names and "host_overhead" in names  # the listing itself worked


def test_a_benchmark_script_imports_transformers():
    """What the clash broke: a script's own process loading transformers' models."""
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "import transformers\n"
            "from transformers import LlamaConfig\n"
            "print(LlamaConfig.model_type)\n")
    for folder in FOLDERS:
        out = subprocess.run([sys.executable, "-c", code, folder], capture_output=True, text=True)
        assert out.returncode == 0, folder + ": " + out.stderr[-2000:]
        assert out.stdout.strip() == "llama"
