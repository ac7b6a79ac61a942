"""The pagedjax side of pagedjax/benchmarks/throughput.py (run in its own process).

``run_pagedjax``: ``LLMEngine`` (continuous batching over the paged KV pool)
after a warm-up that compiles every step shape the workload can reach (the
number of XLA compilations during the timed run is reported; it must be 0),
with KV waste (allocated-but-unfilled slots / allocated, sampled every step),
peak pages and a per-shape-bucket step profile. ``sharing_experiment``: 8
prompts with ``n=4`` vs the same 32 requests sent independently (peak pages
used in both).
"""

from __future__ import annotations

import time

import numpy as np

from pagedjax.benchmarks.workload import mean as _mean
from pagedjax.benchmarks.workload import summary as _summary


def needed_shapes(runner, reqs, max_num_seqs: int, mnbt: int) -> list:
    """The subset of ``runner.warmup_shapes()`` this workload can reach."""
    ps = runner.page_size
    s_max = max(8, 1 << (min(max_num_seqs, len(reqs)) - 1).bit_length())  # the row bucket
    p_max = runner.bucket_sizes(1, 1, -(-max(len(p) + o for p, o in reqs) // ps), True)[2]
    t_max = runner.bucket_sizes(8, min(mnbt, sum(len(p) for p, _ in reqs) + len(reqs)), 1,
                                False)[0]
    return [(s, t, p, d) for s, t, p, d in runner.warmup_shapes()
            if s <= s_max and p <= p_max and (d or t <= t_max)]


def _drive(engine, reqs, params_of, tag: str, sample_every_step=None) -> tuple[dict, float]:
    """Add all requests at once and step to the end. -> ({request id: final output}, seconds)."""
    t0 = time.perf_counter()
    ids = []
    for i, (prompt, out_len) in enumerate(reqs):
        rid = f"{tag}-{i}"
        # Its own cache salt: requests share pages only by forking (n > 1), never through
        # the prefix cache (on by default), so the sharing figure means what it says.
        engine.add_request(rid, {"prompt_token_ids": prompt, "cache_salt": rid},
                           params_of(out_len))
        ids.append(rid)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if sample_every_step is not None:
            sample_every_step()
    return done, time.perf_counter() - t0


def step_profile(times, shapes) -> list[dict]:
    """Where the pagedjax run's time goes: steps grouped by padded shape bucket.

    ``times``/``shapes`` are ``Runner.step_times``/``Runner.step_shapes`` of the run
    (device step incl. the host<->device copies; host scheduling is not in them).
    """
    groups: dict[tuple, list] = {}
    for dt, (decode, s, t, rows, tokens) in zip(times, shapes):
        g = groups.setdefault(("decode" if decode else "mixed", s, t), [0, 0.0, 0, 0])
        g[0] += 1
        g[1] += dt
        g[2] += rows
        g[3] += tokens
    total = sum(times) or 1.0
    out = []
    for (kind, s, t), (n, sec, rows, tokens) in sorted(groups.items()):
        out.append({"kind": kind, "rows_bucket": s, "tokens_bucket": t, "steps": n,
                    "seconds": sec, "mean_step_ms": 1000 * sec / n, "share": sec / total,
                    "mean_rows": rows / n, "tokens": tokens})
    return out


def quantization_arg(ns) -> str | None:
    """The weights' mode for ``--quantization``: none -> None (float weights, passed to
    ``LLM`` as "none" so a GGUF file is dequantized as the flag says)."""
    q = getattr(ns, "quantization", "none")
    return None if q in (None, "none") else q


def run_pagedjax(reqs, ns) -> tuple[dict, object]:
    from pagedjax import LLM, SamplingParams
    from pagedjax.worker.plan import CompileCounter

    max_len = max(len(p) + o for p, o in reqs)
    mml = ns.max_model_len or max(128, -(-(max_len + 1) // 16) * 16)
    t = time.perf_counter()
    extra = {"kv_cache_dtype": getattr(ns, "kv_cache_dtype", "auto")}
    if getattr(ns, "prefix_caching", "default") != "default":
        extra["enable_prefix_caching"] = ns.prefix_caching == "on"
    llm = LLM(model=ns.model, max_model_len=mml, max_num_seqs=ns.max_num_seqs,
              attention_backend=ns.attention_backend,
              max_num_batched_tokens=ns.max_num_batched_tokens, num_pages=ns.num_pages,
              seed=ns.seed, quantization=quantization_arg(ns) or "none", **extra)
    load_s = time.perf_counter() - t
    engine = llm.llm_engine
    runner, sched = engine.runner, engine.scheduler

    def params_of(n):
        return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False)

    c0 = CompileCounter.count
    t = time.perf_counter()
    if ns.warmup == "pass":
        _drive(engine, reqs, params_of, "warm")
        shapes = None
    else:
        shapes = needed_shapes(runner, reqs, ns.max_num_seqs, runner.max_num_batched_tokens)
        runner.warmup(progress=not ns.quiet, shapes=shapes)
    warmup_s = time.perf_counter() - t
    warmup_compiles = CompileCounter.count - c0

    waste, used = [], []

    def sample():
        if sched.running:
            waste.append(sched.kv_waste())
        used.append(sched.stats().used)

    n_steps0, n_times0 = engine.num_steps, len(runner.step_times)
    c1 = CompileCounter.count
    done, dur = _drive(engine, reqs, params_of, "run", sample)
    compiles = CompileCounter.count - c1
    ttfts, tpots, bad = [], [], []
    for i, (_, out_len) in enumerate(reqs):
        o = done[f"run-{i}"]
        got = len(o.outputs[0].token_ids)
        if got != out_len:
            bad.append((i, out_len, got))
        m = o.metrics
        ttfts.append(m.first_token_time - m.arrival_time)
        if out_len > 1:
            tpots.append((m.finished_time - m.first_token_time) / (out_len - 1))
    if bad:
        raise RuntimeError(f"pagedjax produced wrong output lengths (index, want, got): {bad[:5]}")
    step_times = list(runner.step_times)[n_times0:]
    profile = step_profile(step_times, list(runner.step_shapes)[n_times0:])
    res = _summary(
        "pagedjax", reqs, dur, ttfts, tpots,
        load_s=load_s, warmup=ns.warmup, warmup_s=warmup_s,
        prefix_caching=engine.args.enable_prefix_caching,
        warmup_shapes=None if shapes is None else len(shapes),
        warmup_compilations=warmup_compiles, compilations_after_warmup=compiles,
        num_steps=engine.num_steps - n_steps0,
        mean_step_ms=1000 * float(np.mean(step_times)) if step_times else None,
        kv_waste_mean=_mean(waste), kv_waste_max=max(waste) if waste else None,
        peak_pages_used=max(used) if used else 0, num_pages=engine.num_pages,
        quantization=quantization_arg(ns), weight_bytes=engine.weight_bytes,
        page_size=engine.args.page_size, max_model_len=mml, max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=runner.max_num_batched_tokens, step_profile=profile)
    res["_tokens"] = [list(done[f"run-{i}"].outputs[0].token_ids) for i in range(len(reqs))]
    return res, llm


def sharing_experiment(llm, vocab: int, ns) -> dict:
    """8 prompts x n=4 vs the same 32 requests sent independently: peak pages used."""
    from pagedjax import SamplingParams

    engine = llm.llm_engine
    sched = engine.scheduler
    rng = np.random.default_rng(ns.seed + 1)
    plen = ns.sharing_prompt_len or max(48, int(ns.input_mean))
    out_len = max(2, int(ns.sharing_output_len))
    lo, hi = min(100, vocab // 4), min(vocab, 30000)
    prompts = [rng.integers(lo, hi, plen).tolist() for _ in range(8)]
    res = {"prompts": 8, "n": 4, "prompt_len": plen, "output_len": out_len,
           "note": "greedy; page counts do not depend on the sampled values"}
    for name, items, n in (("n4", prompts, 4), ("independent", [p for p in prompts for _ in range(4)], 1)):
        peak_used, peak_saved, peak_refs = [0], [0], [0]

        def sample():
            st = sched.stats()
            peak_used[0] = max(peak_used[0], st.used)
            peak_saved[0] = max(peak_saved[0], st.pages_saved_by_sharing)
            peak_refs[0] = max(peak_refs[0], st.total_refs)

        done, dur = _drive(engine, [(p, out_len) for p in items],
                           lambda L, n=n: SamplingParams(n=n, max_tokens=L, ignore_eos=True,
                                                         temperature=0.0, detokenize=False),
                           f"share-{name}", sample)
        seqs = sum(len(o.outputs) for o in done.values())
        toks = sum(len(c.token_ids) for o in done.values() for c in o.outputs)
        res[name] = {"sequences": seqs, "output_tokens": toks, "peak_pages_used": peak_used[0],
                     "peak_pages_referenced": peak_refs[0],
                     "peak_pages_saved_by_sharing": peak_saved[0], "duration_s": dur}
    a, b = res["n4"]["peak_pages_used"], res["independent"]["peak_pages_used"]
    res["pages_saved"] = b - a
    res["saving_fraction"] = (b - a) / b if b else None
    return res


