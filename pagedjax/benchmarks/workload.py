"""Workloads and per-system summaries shared by the throughput benchmark's processes.

Two ShareGPT-shaped (lognormal) workloads, scaled down for 2 CPU cores (the
vLLM paper reports mean 161 input / 338 output tokens for ShareGPT):

* ``sharegpt``: 64 requests, mean ~80 in / ~120 out (the default);
* ``long``: 32 requests, mean ~64 in / ~256 out: longer outputs, where the
  decode steps (not prefill) decide the speed.

Prompts are random real token ids of the vocabulary; every request must
generate exactly its drawn output length (``ignore_eos``), greedy.
"""

from __future__ import annotations

import math

import numpy as np

SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT = 161, 338
HF_STATIC_BATCH = 16  # the transformers static baseline's batch size
WORKLOADS = {
    "sharegpt": {"num_requests": 64, "input_mean": 80.0, "output_mean": 120.0},
    "long": {"num_requests": 32, "input_mean": 64.0, "output_mean": 256.0},
}


def make_workload(n: int, input_mean: float, output_mean: float, vocab: int, seed: int,
                  sigma: float = 0.8, min_len: int = 4) -> list[tuple[list[int], int]]:
    """[(prompt token ids, output length)]: lognormal lengths with the given means, clipped.

    Token ids are drawn from [lo, hi) of the vocabulary, away from the special
    tokens at the start (the same ids go to every system).
    """
    rng = np.random.default_rng(seed)

    def draw(mean):
        mu = math.log(max(mean, 1.0)) - sigma ** 2 / 2  # E[lognormal] = mean
        x = rng.lognormal(mu, sigma, n).round().astype(int)
        return np.clip(x, min(min_len, int(mean)), max(int(4 * mean), min_len))

    ins, outs = draw(input_mean), draw(output_mean)
    lo = min(100, vocab // 4)
    hi = min(vocab, 30000)
    return [(rng.integers(lo, hi, int(i)).tolist(), int(o)) for i, o in zip(ins, outs)]


def mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def latency(ttfts, tpots) -> dict:
    return {"mean_ttft_ms": None if mean(ttfts) is None else 1000 * mean(ttfts),
            "median_ttft_ms": float(1000 * np.median(ttfts)) if ttfts else None,
            "mean_tpot_ms": None if mean(tpots) is None else 1000 * mean(tpots)}


def summary(name, reqs, duration, ttfts, tpots, **extra) -> dict:
    out_tokens = sum(o for _, o in reqs)
    res = {"system": name, "num_requests": len(reqs), "duration_s": duration,
           "output_tokens": out_tokens, "input_tokens": sum(len(p) for p, _ in reqs),
           "output_tokens_per_s": out_tokens / duration, "requests_per_s": len(reqs) / duration}
    res.update(latency(ttfts, tpots))
    res.update(extra)
    return res


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean fraction of each output that matches before the first differing token (greedy)."""
    fr = []
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        fr.append(k / max(1, len(x)))
    return float(np.mean(fr)) if fr else 0.0
