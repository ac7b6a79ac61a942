"""Plots of the headline figures in BENCHMARKS.md, one small PNG per figure file.

    python benchmarks/plot.py            # benchmarks/figures/*.json -> docs/images/benchmarks/
    python benchmarks/plot.py --figures DIR --out DIR

Each ``benchmarks/figures/<name>.json`` holds the numbers of one headline figure,
transcribed from BENCHMARKS.md, with the command(s) that measured them, the date,
the code and the machine; ``<name>.png`` is written beside the others in the
output folder, the date and machine printed under the plot. Two kinds:

* ``"kind": "bars"``: ``categories`` on the x axis, one bar per ``series``
  (``values``, ``null`` for none) or stacked bars (``"stacked": true``);
* ``"kind": "xy"``: ``series`` of ``x``/``y`` drawn as a ``line``, a ``dashed``
  line or ``points`` (``"median_line": true`` joins the median y of each x);
  ``targets`` are marked points, ``hlines`` labelled horizontal lines, and
  ``xscale``/``yscale`` take ``log2``/``log`` and ``yticks`` lists the y ticks.

Prints one row per PNG written (name, bytes) and writes no JSON of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# Run as a script, this folder is sys.path[0], and its subfolders (kernels/, step/, ...)
# would shadow installed packages of the same name for every import below.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIGSIZE = (6.4, 3.6)
DPI = 100
COLORS = ("#1f5fa8", "#d9822b", "#6a9e3f", "#8e5ea2")


def _scale(ax, axis: str, how: str | None) -> None:
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    if how == "log2":
        setter("log", base=2)
    elif how == "log":
        setter("log")


def _bars(ax, fig: dict) -> None:
    cats = fig["categories"]
    series = fig["series"]
    stacked = fig.get("stacked", False)
    width = 0.6 if stacked else 0.8 / len(series)
    bottoms = [0.0] * len(cats)
    for i, s in enumerate(series):
        vals = s["values"]
        xs = [j if stacked else j + (i - (len(series) - 1) / 2) * width for j in range(len(cats))]
        pairs = [(x, v, b) for x, v, b in zip(xs, vals, bottoms) if v is not None]
        if not pairs:
            continue
        bars = ax.bar([p[0] for p in pairs], [p[1] for p in pairs], width,
                      bottom=[p[2] if stacked else 0.0 for p in pairs],
                      label=s["label"], color=COLORS[i % len(COLORS)])
        ax.bar_label(bars, labels=[f"{p[1]:g}" for p in pairs],
                     label_type="center" if stacked else "edge", fontsize=7)
        if stacked:
            bottoms = [b + (v or 0.0) for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(cats)), cats, fontsize=8)


def _xy(ax, fig: dict) -> None:
    for i, s in enumerate(fig["series"]):
        color = COLORS[i % len(COLORS)]
        style = s.get("style", "line")
        if style == "points":
            ax.plot(s["x"], s["y"], "o", ms=4, alpha=0.6, color=color, label=s["label"])
            if s.get("median_line"):
                xs = sorted(set(s["x"]))
                med = [statistics.median(y for x, y in zip(s["x"], s["y"]) if x == x0) for x0 in xs]
                ax.plot(xs, med, "-", color=color)
        else:
            ax.plot(s["x"], s["y"], "--" if style == "dashed" else "-", marker="o", ms=4,
                    color=color, label=s["label"])
    targets = fig.get("targets", [])
    if targets:
        ax.plot([t["x"] for t in targets], [t["y"] for t in targets], "x", ms=9, mew=2,
                color="#b22222", label=fig.get("targets_label", "targets"))
    _scale(ax, "x", fig.get("xscale"))
    _scale(ax, "y", fig.get("yscale"))
    xs = sorted({x for s in fig["series"] for x in s["x"]})
    ax.set_xticks(xs, [str(x) for x in xs], fontsize=8)
    ax.minorticks_off()
    if "yticks" in fig:
        ax.set_yticks(fig["yticks"], [f"{y:g}" for y in fig["yticks"]], fontsize=8)


def draw(fig: dict, path: str) -> None:
    """One figure file's numbers -> one PNG at ``path``."""
    f, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    if fig["kind"] == "bars":
        _bars(ax, fig)
    elif fig["kind"] == "xy":
        _xy(ax, fig)
    else:
        raise ValueError(f"{path}: kind must be 'bars' or 'xy', not {fig['kind']!r}")
    for j, h in enumerate(fig.get("hlines", [])):
        ax.axhline(h["y"], color="#555555", lw=1, ls=":" if j % 2 else "--", label=h["label"])
    if "ylim" in fig:
        ax.set_ylim(*fig["ylim"])
    ax.set_title(fig["title"], fontsize=9)
    ax.set_xlabel(fig.get("xlabel", ""), fontsize=8)
    ax.set_ylabel(fig.get("ylabel", ""), fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    source = f"{fig['date']}; {fig['machine']}"
    f.text(0.01, 0.01, "\n".join(textwrap.wrap(source, 130)), fontsize=5.5, color="#444444",
           va="bottom")
    f.tight_layout(rect=(0, 0.06, 1, 1))
    f.savefig(path, dpi=DPI)
    plt.close(f)


REQUIRED = ("title", "kind", "series", "commands", "date", "machine")


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        fig = json.load(fh)
    missing = [k for k in REQUIRED if k not in fig]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (each figure records its "
                         "source command(s), date and machine)")
    return fig


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--figures", default=os.path.join(HERE, "figures"),
                    help="folder of figure JSON files")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "images", "benchmarks"),
                    help="folder the PNGs go to")
    args = ap.parse_args(argv)
    names = sorted(n for n in os.listdir(args.figures) if n.endswith(".json"))
    if not names:
        raise SystemExit(f"no figure files (*.json) in {args.figures}")
    os.makedirs(args.out, exist_ok=True)
    written = []
    print(f"{'figure':<24} {'bytes':>8}")
    for name in names:
        png = os.path.join(args.out, name[:-5] + ".png")
        draw(load(os.path.join(args.figures, name)), png)
        written.append(png)
        print(f"{name[:-5]:<24} {os.path.getsize(png):>8}")
    return written


if __name__ == "__main__":
    main()
