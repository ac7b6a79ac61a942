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


def _layout_paths() -> set[str]:
    """Every file path the Layout block of docs/architecture.md names."""
    import re

    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    stack: list[tuple[int, str]] = []
    named = set()
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m or not line.strip():
            continue
        indent, first = len(m.group(1)), m.group(2)
        if first.endswith(",") and line.split()[1].endswith(".h"):
            first = line.split()[0].rstrip(",") + " " + line.split()[1]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prefix = "/".join(d for _, d in stack)
        if first.endswith("/"):
            stack.append((indent, first.rstrip("/")))
            continue
        for name in first.split():
            named.add(f"{prefix}/{name}" if prefix else name)
    return named


def test_every_module_is_named_in_the_layout():
    """docs/architecture.md's Layout lists every module where it lives."""
    named = _layout_paths()
    missing = []
    for top, installed in (("pagedjax", "pagedjax"), ("models", "pagedjax/models"),
                           ("kernels_pallas", "pagedjax/kernels_pallas")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            rel = os.path.relpath(dirpath, os.path.join(ROOT, top))
            for f in filenames:
                if not f.endswith(".py") or f == "__init__.py":
                    continue
                path = f"{installed}/{f}" if rel == "." else f"{installed}/{rel}/{f}"
                if path not in named:
                    missing.append(path)
    assert not missing, f"docs/architecture.md's Layout does not name: {missing}"
