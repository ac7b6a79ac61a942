"""The architecture rules of docs/architecture.md, checked with import-linter.

The contracts live in pyproject.toml ([tool.importlinter]); this runs them the
way a developer would (`lint-imports`) so that the README's test command
enforces them.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_contracts_hold():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count(" KEPT") >= 5 and "BROKEN" not in out, out[-4000:]


def test_contracts_catch_a_violation(tmp_path):
    """The host-only contract is live: a scheduler that imports jax breaks it."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
        ".venv", ".git", "*.gguf", "notebooks", "benchmarks", "tests", "__pycache__"))
    sched = copy / "pagedjax" / "scheduler.py"
    sched.write_text(sched.read_text() + "\nimport jax  # noqa\n")
    env = dict(os.environ, PYTHONPATH=str(copy))
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())"],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "host-only (no JAX) BROKEN" in proc.stdout
