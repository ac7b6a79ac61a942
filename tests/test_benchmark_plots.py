"""BENCHMARKS.md, the results page: benchmarks/plot.py turns every committed figure
file into a small PNG, the page shows PNGs that exist, and every link into the page
names a section it has."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.utils.paths import REPO_ROOT

FIGURES = REPO_ROOT / "benchmarks" / "figures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png_per_figure_file(tmp_path):
    pytest.importorskip("matplotlib")
    names = sorted(p.stem for p in FIGURES.glob("*.json"))
    assert {"throughput", "step_vs_floor", "host_time", "startup"} <= set(names)
    out = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "plot.py"),
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(p.stem for p in tmp_path.glob("*.png")) == names
    for name in names:
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
        assert 5_000 < os.path.getsize(png) < 60_000, f"{name}.png: {os.path.getsize(png)} bytes"
        assert name in out.stdout  # the printed table names each PNG


def test_every_figure_records_its_source():
    for path in FIGURES.glob("*.json"):
        fig = json.loads(path.read_text())
        for key in ("commands", "date", "machine"):
            assert fig.get(key), f"{path.name}: no {key}"
        for cmd in fig["commands"]:
            script = cmd.split()[1] if cmd.startswith("python ") else None
            assert cmd.startswith(("python benchmarks/", "pagedjax bench ")), cmd
            assert script is None or (REPO_ROOT / script).is_file(), cmd


def test_a_figure_without_its_source_is_refused(tmp_path):
    pytest.importorskip("matplotlib")
    figs = tmp_path / "figures"
    figs.mkdir()
    (figs / "bad.json").write_text(json.dumps({"title": "t", "kind": "bars", "series": []}))
    out = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "plot.py"),
                          "--figures", str(figs), "--out", str(tmp_path / "png")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "missing commands, date, machine" in out.stderr


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_into_the_results_page_name_its_sections():
    page = (REPO_ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    anchors = {_slug(h) for h in re.findall(r"^#{2,3} (.+)$", page, re.M)}
    assert {"throughput", "decode-step-vs-the-matmul-floor", "host-time-per-step",
            "start-up-cold-and-warm", "gpu-and-tpu"} <= anchors
    cited = []
    folders = ("docs", "notebooks", "pagedjax", "models", "kernels_pallas", "benchmarks", "tests")
    for folder in folders:
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.suffix in (".md", ".py", ".ipynb", ".cc", ".h") and ".venv" not in path.parts:
                text = path.read_text(encoding="utf-8", errors="replace")
                cited += [(path.name, a) for a in re.findall(r"BENCHMARKS\.md#([\w-]+)", text)]
    cited += [("README.md", a) for a in
              re.findall(r"BENCHMARKS\.md#([\w-]+)", (REPO_ROOT / "README.md").read_text())]
    cited += [("BENCHMARKS.md", a) for a in re.findall(r"\]\(#([\w-]+)\)", page)]
    assert cited, "no link into BENCHMARKS.md found: the scan is broken"
    missing = [c for c in cited if c[1] not in anchors]
    assert not missing, f"links to sections BENCHMARKS.md does not have: {missing}"
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page):
        assert (REPO_ROOT / image).is_file(), image
