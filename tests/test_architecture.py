"""The architecture rules of docs/architecture.md, checked with import-linter.

The contracts live in pyproject.toml ([tool.importlinter]). The repository keeps
``models/`` and ``kernels_pallas/`` at its top level, but they install as
``pagedjax.models`` and ``pagedjax.kernels_pallas``; import-linter walks one
folder per package, so the test assembles that installed layout in a temporary
folder and runs ``lint-imports`` there. Run it by hand with
``python -m pytest tests/test_architecture.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORE = shutil.ignore_patterns("__pycache__", "*.so", "*.gguf")


def installed_layout(dest) -> str:
    """Copy pagedjax/ with models/ and kernels_pallas/ inside it, as pip installs them."""
    dest = str(dest)
    shutil.copytree(os.path.join(ROOT, "pagedjax"), os.path.join(dest, "pagedjax"), ignore=IGNORE)
    for name in ("models", "kernels_pallas"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(dest, "pagedjax", name), ignore=IGNORE)
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), dest)
    return dest


def lint_imports(cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c",
                           "import sys; sys.path.insert(0, '.'); "
                           "from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())"],
                          cwd=cwd, env=dict(os.environ, PYTHONPATH=cwd),
                          capture_output=True, text=True, timeout=300)


def test_import_contracts_hold(tmp_path):
    proc = lint_imports(installed_layout(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count(" KEPT") >= 4 and "BROKEN" not in out, out[-4000:]


def test_contracts_catch_a_violation(tmp_path):
    """The contracts are live: a scheduler that imports jax, and a page pool that
    imports the engine, each break one."""
    root = installed_layout(tmp_path)
    sched = os.path.join(root, "pagedjax", "core", "scheduler.py")
    with open(sched, "a") as f:
        f.write("\nimport jax  # noqa\n")
    pool = os.path.join(root, "pagedjax", "core", "page_pool.py")
    with open(pool, "a") as f:
        f.write("\nimport pagedjax.engine.llm_engine  # noqa\n")
    proc = lint_imports(root)
    assert proc.returncode != 0
    assert "host-only (no JAX) BROKEN" in proc.stdout
    assert "Layers: " in proc.stdout and proc.stdout.count("BROKEN") >= 2, proc.stdout[-3000:]
