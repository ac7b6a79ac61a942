"""pagedjax installs as one import namespace.

``models/`` and ``kernels_pallas/`` are top-level folders of the repository but
install as ``pagedjax.models`` and ``pagedjax.kernels_pallas``: a user's own
``models`` package (ML projects keep checkpoints in ``models/``, every Django app
has a ``models.py``) can neither shadow them nor be shadowed.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest

from tests.utils.paths import REPO


def _listed_packages() -> set[str]:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return set(tomllib.load(f)["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_listed_in_pyproject():
    listed = _listed_packages()
    found = set()
    for top, name in (("pagedjax", "pagedjax"), ("models", "pagedjax.models"),
                      ("kernels_pallas", "pagedjax.kernels_pallas")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(REPO, top))
                found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    assert found == listed, f"not listed: {sorted(found - listed)}; listed, absent: {sorted(listed - found)}"


@pytest.mark.slow
def test_generate_beside_a_users_models_package(tmp_path, smollm2_gguf):
    """LLM() and a generate in a folder that holds a `models/` package and a `models.py`."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("raise ImportError('the user models package')\n")
    (tmp_path / "models.py").write_text("raise ImportError('the user models.py')\n")
    (tmp_path / "kernels_pallas.py").write_text("raise ImportError('the user kernels_pallas.py')\n")
    code = ("from pagedjax import LLM, SamplingParams\n"
            f"llm = LLM(model={smollm2_gguf!r}, max_model_len=128, max_num_seqs=2)\n"
            "out = llm.generate(['The capital of France is'], SamplingParams(max_tokens=4))\n"
            "print('TEXT', repr(out[0].outputs[0].text), len(out[0].outputs[0].token_ids))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TEXT" in proc.stdout and proc.stdout.strip().endswith(" 4"), proc.stdout[-500:]


@pytest.mark.slow
def test_non_editable_install_in_a_fresh_venv(tmp_path):
    """A wheel of the repository, installed into a fresh virtual environment, imports
    from there (not from the checkout) with the C++ sources and the shipped bench."""
    wheels = tmp_path / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                           REPO], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = glob.glob(str(wheels / "pagedjax-*.whl"))
    assert len(wheel) == 1
    assert _torch_imports(wheel[0]) == [], "the installed package must hold no torch code"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    proc = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel[0]],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The dependencies come from this environment's site-packages, after the venv's own.
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "zz_deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    code = ("import os, pagedjax, pagedjax.models, pagedjax.kernels_pallas.cpu.native as n\n"
            "import pagedjax.benchmarks.throughput, pagedjax.entrypoints.openai.app\n"
            "here = os.path.dirname(pagedjax.__file__)\n"
            "assert pagedjax.models.__file__.startswith(here), pagedjax.models.__file__\n"
            "assert os.path.exists(os.path.join(os.path.dirname(n.__file__), 'attention.cc'))\n"
            "assert os.path.exists(os.path.join(here, 'entrypoints', 'openai', 'static', 'index.html'))\n"
            "print('OK', here)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([py, "-c", code], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("OK " + site), proc.stdout
    proc = subprocess.run([str(venv / "bin" / "pagedjax"), "bench", "throughput", "--help"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "--num-requests" in proc.stdout, proc.stderr[-2000:]
    assert "--hf-baselines" in proc.stdout
    # outside a checkout there is no baselines script: pagedjax alone
    proc = subprocess.run([py, "-c", "from pagedjax.benchmarks.throughput import "
                           "find_hf_baselines as f; print('FOUND', f())"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "FOUND None", proc.stdout + proc.stderr[-2000:]


_TORCH_IMPORT = re.compile(rb"^\s*(import torch|from torch[ .])", re.M)


def _torch_imports(wheel: str) -> list[str]:
    """The wheel's Python files that import torch (at any depth, lazily too)."""
    with zipfile.ZipFile(wheel) as z:
        return [n for n in z.namelist() if n.endswith(".py") and _TORCH_IMPORT.search(z.read(n))]


def test_no_package_source_imports_torch():
    """What the wheel would ship: no module of the package folders imports torch."""
    found = []
    for top in ("pagedjax", "models", "kernels_pallas"):
        for path in glob.glob(os.path.join(REPO, top, "**", "*.py"), recursive=True):
            with open(path, "rb") as f:
                if _TORCH_IMPORT.search(f.read()):
                    found.append(os.path.relpath(path, REPO))
    assert found == [], found
