"""The page pool and the rolling statistics as one self-contained HTML block (inline SVG).

``render(snapshot, points)`` draws what the dashboard draws: the page grid
(free, cached, used coloured by request, used pages in the prefix cache outlined,
shared pages with their reference count), the counters, the requests with their
progress, and small line plots of tokens/s, batch size, KV usage, TTFT and
inter-token latency. No script, no external file; every text is escaped.
"""

from __future__ import annotations

import hashlib
from html import escape

FREE, CACHED = "#e6e8eb", "#9ecbf0"
PLOTS = (("tokens_per_s", "tokens/s", "{:.1f}"), ("batch", "batch size", "{:.0f}"),
         ("kv_usage", "KV usage", "{:.0%}"), ("ttft", "TTFT s", "{:.3f}"),
         ("itl", "inter-token s", "{:.4f}"))


def request_color(rid: str) -> str:
    h = int.from_bytes(hashlib.blake2s(rid.encode(), digest_size=4).digest(), "big")
    return f"hsl({h % 360}, 62%, 52%)"


def grid_svg(snap: dict, cell: int = 14, cols: int = 48) -> str:
    grid, refs = snap["grid"], snap["refs"]
    owner = {}
    for r in snap["requests"]:
        for p in r["pages"]:
            owner.setdefault(p, r["id"])
    cols = max(1, min(cols, len(grid)))
    rows = -(-len(grid) // cols)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * cell}" '
             f'height="{rows * cell}" class="pool-grid">']
    for i, kind in enumerate(grid):
        page = i + 1
        x, y = (i % cols) * cell, (i // cols) * cell
        fill = {".": FREE, "c": CACHED}.get(kind) or request_color(owner.get(page, "?"))
        stroke = ' stroke="#0b4f8a" stroke-width="2"' if kind == "p" else ""
        title = escape(f"page {page}: {owner.get(page, {'.': 'free', 'c': 'cached'}.get(kind, ''))}"
                       + (f", {refs[str(page)]} refs" if str(page) in refs else ""))
        parts.append(f'<rect x="{x + 1}" y="{y + 1}" width="{cell - 2}" height="{cell - 2}" '
                     f'fill="{fill}"{stroke} data-kind="{kind}"><title>{title}</title></rect>')
        if str(page) in refs:
            parts.append(f'<text x="{x + cell / 2}" y="{y + cell - 4}" font-size="{cell - 5}" '
                         f'text-anchor="middle">{int(refs[str(page)])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def plot_svg(points: list[dict], key: str, label: str, fmt: str, w: int = 220,
             h: int = 60) -> str:
    pts = [(p["t"], p[key]) for p in points if p.get(key) is not None]
    now = f" {escape(fmt.format(pts[-1][1]))}" if pts else ""
    body = ""
    if pts:
        t0, t1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1e-6)
        top = max(max(v for _, v in pts), 1.0 if key == "kv_usage" else 1e-9)
        xy = " ".join(f"{(t - t0) / (t1 - t0) * (w - 4) + 2:.1f},"
                      f"{h - 3 - (h - 8) * v / top:.1f}" for t, v in pts)
        body = f'<polyline fill="none" stroke="#1f6feb" stroke-width="1.5" points="{xy}"/>'
    return (f'<figure style="margin:0 8px 0 0;display:inline-block"><figcaption '
            f'style="font-size:11px">{escape(label)}<b>{now}</b></figcaption>'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'style="border:1px solid #ccc">{body}</svg></figure>')


def _requests_table(snap: dict, limit: int = 12) -> str:
    rows = []
    for r in snap["requests"][:limit]:
        done = f"{r['output_tokens']}/{r['max_tokens']}" if r["max_tokens"] else \
            str(r["output_tokens"])
        rows.append(f'<tr><td><span style="color:{request_color(r["id"])}">&#9632;</span> '
                    f'{escape(r["id"])}</td><td>{escape(r["state"])}</td><td>{done}</td>'
                    f'<td>{len(r["pages"])}</td><td>{r["preemptions"]}</td></tr>')
    more = len(snap["requests"]) - limit
    if more > 0:
        rows.append(f'<tr><td colspan="5">... {more} more</td></tr>')
    return ('<table style="font-size:11px"><tr><th>request</th><th>state</th><th>tokens</th>'
            '<th>pages</th><th>preempted</th></tr>' + "".join(rows) + "</table>")


def render(snap: dict | None, points: list[dict]) -> str:
    if snap is None:
        return "<div>pagedjax: no engine step yet</div>"
    c = snap["counts"]
    head = (f'<div style="font-size:12px">running <b>{c["running"]}</b> · waiting '
            f'<b>{c["waiting"]}</b> · pages used <b>{c["used"]}</b>/{c["total"]} · cached '
            f'<b>{c["cached"]}</b> · shared <b>{c["shared"]}</b> · preemptions '
            f'<b>{c["preemptions"]}</b> · steps {c["steps"]}</div>')
    plots = "".join(plot_svg(points, k, label, fmt) for k, label, fmt in PLOTS)
    return (f'<div class="pagedjax-pool">{head}<div style="display:flex;gap:12px">'
            f'<div>{grid_svg(snap)}</div>{_requests_table(snap)}</div><div>{plots}</div></div>')
