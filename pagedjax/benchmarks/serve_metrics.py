"""The report of ``pagedjax bench serve``, in vLLM's terms.

Per request: TTFT (time to the first token), ITL (gaps between later tokens),
TPOT (time per output token after the first: ``(e2el - ttft) / (n - 1)``) and
E2EL (end-to-end latency). For the run: request, output and total token
throughput, mean / median / chosen percentiles of each, and goodput: requests
per second that met every SLO given with ``--goodput`` (``ttft:MS tpot:MS e2el:MS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

METRICS = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


@dataclass
class RequestResult:
    ok: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def tpot(self) -> Optional[float]:
        return (self.e2el - self.ttft) / (self.output_len - 1) if self.output_len > 1 else None


def parse_goodput(items: Optional[list[str]]) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` -> SLOs in ms; ValueError naming a bad item."""
    slos: dict[str, float] = {}
    for item in items or []:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"--goodput {item!r}: the metric must be ttft, tpot or e2el")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: give milliseconds, e.g. ttft:200") from None
        if slos[name] <= 0:
            raise ValueError(f"--goodput {item!r}: the SLO must be > 0 ms")
    return slos


def _meets(r: RequestResult, slos: dict[str, float]) -> bool:
    got = {"ttft": r.ttft, "e2el": r.e2el, "tpot": r.tpot or 0.0}
    return all(got[k] * 1000.0 <= v for k, v in slos.items())


def summarize(results: list[RequestResult], duration: float, percentiles: list[float],
              slos: dict[str, float]) -> dict:
    ok = [r for r in results if r.ok]
    values = {"ttft": [r.ttft for r in ok], "e2el": [r.e2el for r in ok],
              "tpot": [r.tpot for r in ok if r.tpot is not None],
              "itl": [x for r in ok for x in r.itl]}
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    rep: dict = {"completed": len(ok), "failed": len(results) - len(ok), "duration": duration,
                 "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
                 "request_throughput": len(ok) / duration if duration else 0.0,
                 "output_throughput": out_tokens / duration if duration else 0.0,
                 "total_token_throughput": (in_tokens + out_tokens) / duration
                 if duration else 0.0}
    if slos:
        good = sum(_meets(r, slos) for r in ok)
        rep["request_goodput"] = good / duration if duration else 0.0
    for name, xs in values.items():
        a = np.asarray(xs, float) * 1000.0
        rep[f"mean_{name}_ms"] = float(a.mean()) if a.size else 0.0
        rep[f"median_{name}_ms"] = float(np.median(a)) if a.size else 0.0
        rep[f"std_{name}_ms"] = float(a.std()) if a.size else 0.0
        for p in percentiles:
            rep[f"p{p:g}_{name}_ms"] = float(np.percentile(a, p)) if a.size else 0.0
    rep["errors"] = [r.error for r in results if not r.ok][:20]
    return rep


def table(rep: dict, metrics: list[str], percentiles: list[float], title: str) -> str:
    lines = [f"{' ' + title + ' ':=^50}"]

    def row(label, value, fmt="{:.2f}"):
        lines.append(f"{label:<40}{fmt.format(value) if not isinstance(value, str) else value:>10}")

    row("Successful requests:", rep["completed"], "{}")
    row("Failed requests:", rep["failed"], "{}")
    if rep.get("max_concurrency") is not None:
        row("Maximum request concurrency:", rep["max_concurrency"], "{}")
    row("Request rate configured (RPS):", str(rep.get("request_rate", "inf")))
    row("Benchmark duration (s):", rep["duration"])
    row("Total input tokens:", rep["total_input_tokens"], "{}")
    row("Total generated tokens:", rep["total_output_tokens"], "{}")
    row("Request throughput (req/s):", rep["request_throughput"])
    if "request_goodput" in rep:
        row("Request goodput (req/s):", rep["request_goodput"])
    row("Output token throughput (tok/s):", rep["output_throughput"])
    row("Total Token throughput (tok/s):", rep["total_token_throughput"])
    for m in metrics:
        lines.append(f"{METRICS[m]:-^50}")
        up = m.upper()
        row(f"Mean {up} (ms):", rep[f"mean_{m}_ms"])
        row(f"Median {up} (ms):", rep[f"median_{m}_ms"])
        for p in percentiles:
            row(f"P{p:g} {up} (ms):", rep[f"p{p:g}_{m}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)
