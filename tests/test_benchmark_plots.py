"""benchmarks/plot.py turns every committed figure file into a small PNG."""

from __future__ import annotations

import json
import os
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
