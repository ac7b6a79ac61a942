"""Speculative decoding: output tokens/s, acceptance rate and mean accepted length with
speculation off, n-gram prompt lookup and a draft model, at batch 1 and batch 16, on a
repetitive workload and on a random one; every cell in its own fresh process.

    python benchmarks/features/spec_decode.py                                  # the full grid
    python benchmarks/features/spec_decode.py --batches 1 --workloads repeat --methods off,ngram

Target: the real default model, SmolLM2-135M-Instruct (the GGUF in the venv), greedy,
``ignore_eos`` (every method emits the same number of tokens; greedy speculation is
token-for-token identical to none, and the parent checks the cells agree).

Workloads (built the same way in every child):

* ``repeat``: "repeat/copy/rewrite the following text" chat prompts over four fixed
  English paragraphs (4 instructions x 4 paragraphs = 16 distinct prompts). The
  answer copies its prompt, so prompt lookup (n-gram) finds its continuations;
* ``random``: the random-token ShareGPT-shaped requests of pagedjax/benchmarks/throughput.py
  (``benchmarks/workload.make_workload``: lognormal lengths, random token ids),
  scaled by ``--input-mean``; there is nothing to look up, so n-gram rarely proposes.

Batch B: ``max_num_seqs=B`` and B requests at once (``--batch1-requests`` requests for
B = 1, run one after another by the engine). Output lengths: ``--output-len`` for every
request (random: the workload's drawn lengths, capped there).

Methods (vLLM's ``speculative_config``, k = ``--k`` tokens proposed per step):

* ``off``: no speculation (the engine's default overlapped steps);
* ``ngram``: ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
  "prompt_lookup_min": 2}``;
* ``draft``: ``{"model": <folder>, "num_speculative_tokens": k}``. There is no smaller
  model of SmolLM2's tokenizer offline, so the draft is *self-speculative*: SmolLM2's
  own first ``--draft-layers`` layers (of 30) with its final norm and (tied) LM head,
  written as an HF folder (config.json + model.safetensors, float32) into a temporary
  directory at start from the GGUF's dequantized weights (``models.open_checkpoint``),
  deleted at the end and never committed. It is an honest stand-in for a small draft
  of the same family: cheaper than the target by about the ratio of layers (the LM
  head is shared cost), and it agrees with the target only as far as early layers
  predict the last ones;
* ``draft_self`` (not in the default grid): the target GGUF as its own draft, the
  upper bound on acceptance (every greedy proposal is accepted), which prices the
  mechanism's overhead.

Each child loads the engine, runs the cell's requests once as warm-up (compiles every
shape the timed pass reaches; compilations in the timed pass are reported), then times
one pass: output tokens / wall time, mean TPOT, steps, the engine's speculative totals
over the pass (acceptance = accepted / proposed, mean accepted length = 1 + accepted /
verified rows with proposals, vLLM's definitions) and the pages still held at the end
(must be 0). Prints a table and writes JSON with the machine block
(default benchmarks/results/spec_decode.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from pagedjax.benchmarks.throughput import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __package__ in (None, ""):  # `python benchmarks/features/spec_decode.py`
    sys.path.insert(0, ROOT)

METHODS = ("off", "ngram", "draft", "draft_self")
DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "spec_decode.json")

PARAGRAPHS = [
    "The harbour town woke slowly. Fishing boats came in with the tide, gulls followed "
    "them, and the market stalls opened one by one along the stone quay. By nine the "
    "smell of bread and coffee had reached the church on the hill.",
    "To install the package, create a virtual environment, activate it, and run pip "
    "install with the name of the package. Then import it in Python and call the main "
    "function with the path of your data folder as its only argument.",
    "Photosynthesis turns light into chemical energy. Plants take in carbon dioxide and "
    "water, and with the energy of sunlight they build sugars and release oxygen. Most of "
    "the oxygen in the air we breathe was made this way.",
    "The meeting is moved to Thursday at three in the small conference room. Please bring "
    "the quarterly figures, the draft of the budget and your questions about the new "
    "travel policy. Lunch will not be provided this time.",
]
INSTRUCTIONS = [
    "Repeat the following text exactly, word for word:",
    "Copy this paragraph without changing anything:",
    "Rewrite the following text, keeping every sentence:",
    "Say the following text back to me:",
]


# ----------------------------------------------------------------------------- draft model


def write_draft_folder(model: str | None, folder: str, num_layers: int) -> str:
    """An HF Llama folder holding the first ``num_layers`` layers of ``model`` (plus
    its embedding, final norm and LM head), float32, dequantized from a GGUF."""
    import numpy as np
    from safetensors.numpy import save_file

    import pagedjax.models as models

    resolved = models.resolve_model(model)
    ckpt = models.open_checkpoint(resolved)
    cfg = dict(ckpt.config)
    if cfg.get("model_type") != "llama":
        raise ValueError(f"the self-speculative draft is built for Llama models, got "
                         f"{cfg.get('model_type')!r}")
    if not 1 <= num_layers < int(cfg["num_hidden_layers"]):
        raise ValueError(f"--draft-layers must be in [1, {cfg['num_hidden_layers'] - 1}]")
    cfg["num_hidden_layers"] = num_layers
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.get("tie_word_embeddings", False):
        names.append("lm_head.weight")
    for i in range(num_layers):
        names += [f"model.layers.{i}.{p}.weight" for p in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
            "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")]
    tensors = {n: np.ascontiguousarray(np.asarray(ckpt.get(n), np.float32)) for n in names}
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    cfg["torch_dtype"] = "float32"
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


# ----------------------------------------------------------------------------- child


def _workload(llm, ns, workload: str, batch: int):
    """[(prompt token ids, output length)] of a cell."""
    n = batch if batch > 1 else ns.batch1_requests
    if workload == "random":
        from pagedjax.benchmarks.workload import make_workload

        vocab = llm.llm_engine.model.info.vocab_size
        reqs = make_workload(n, ns.input_mean, ns.output_len, vocab, ns.seed)
        return [(p, min(o, ns.output_len)) for p, o in reqs]
    tok = llm.get_tokenizer()
    out = []
    for i in range(n):
        text = f"{INSTRUCTIONS[(i // 4) % 4]}\n\n{PARAGRAPHS[i % 4]}"
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True, tokenize=False)
            ids = tok.encode(text, add_special_tokens=False)
        else:
            ids = tok.encode(text + "\n\n")
        out.append((list(ids), ns.output_len))
    return out


def _spec_config(ns, method: str, draft_folder: str | None):
    if method == "off":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": ns.k, "prompt_lookup_max": 4,
                "prompt_lookup_min": 2}
    if method == "draft":
        return {"model": draft_folder, "num_speculative_tokens": ns.k}
    import pagedjax.models as models

    r = models.resolve_model(ns.model)
    path = os.path.join(r.path, r.gguf_file) if r.gguf_file else r.path
    return {"model": path, "num_speculative_tokens": ns.k}


def _drive(engine, reqs, tag: str):
    from pagedjax import SamplingParams

    t0 = time.perf_counter()
    for i, (prompt, out_len) in enumerate(reqs):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True,
                                          detokenize=False))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[f"{tag}-{i}"] for i in range(len(reqs))], time.perf_counter() - t0


def child(ns) -> dict:
    from pagedjax import LLM
    from pagedjax.worker.plan import CompileCounter

    spec = _spec_config(ns, ns.method, ns.draft_folder)
    t = time.perf_counter()
    llm = LLM(model=ns.model, max_model_len=ns.max_model_len, max_num_seqs=ns.batch,
              speculative_config=spec, enable_prefix_caching=False, seed=ns.seed)
    load_s = time.perf_counter() - t
    eng = llm.llm_engine
    reqs = _workload(llm, ns, ns.workload, ns.batch)
    t = time.perf_counter()
    _drive(eng, reqs, "warm")
    warm_s = time.perf_counter() - t
    s0 = eng.spec_decode_stats() or {}
    c0, steps0 = CompileCounter.count, eng.num_steps
    outs, wall = _drive(eng, reqs, "run")
    s1 = eng.spec_decode_stats() or {}
    st = {k: s1[k] - s0.get(k, 0) for k in s1}
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    tpots = [(o.metrics.finished_time - o.metrics.first_token_time) / (n - 1)
             for o in outs if (n := len(o.outputs[0].token_ids)) > 1]
    steps = eng.num_steps - steps0
    drafts, proposed, accepted = (st.get("num_drafts", 0), st.get("num_draft_tokens", 0),
                                  st.get("num_accepted_tokens", 0))
    return {
        "workload": ns.workload, "batch": ns.batch, "method": ns.method, "speculative_config": spec,
        "num_requests": len(reqs), "input_tokens": sum(len(p) for p, _ in reqs),
        "output_tokens": n_out, "wall_s": wall, "output_tokens_per_s": n_out / wall,
        "mean_tpot_ms": 1000 * sum(tpots) / len(tpots) if tpots else None,
        "steps": steps, "ms_per_step": 1000 * wall / max(steps, 1),
        "num_drafts": drafts, "num_draft_tokens": proposed, "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_accepted_length": 1 + accepted / drafts if drafts else None,
        "compilations_in_timed_pass": CompileCounter.count - c0,
        "pages_used_after": eng.pool_stats().used, "load_s": load_s, "warmup_s": warm_s,
        "pid": os.getpid(), "tokens": [list(o.outputs[0].token_ids) for o in outs],
    }


# ----------------------------------------------------------------------------- parent


def run_cell(argv_base: list[str], workload: str, batch: int, method: str,
             draft_folder: str | None, tmp: str) -> dict:
    """One cell in a fresh interpreter; -> its result with the load around it."""
    from pagedjax.benchmarks import machine

    out = os.path.join(tmp, f"{workload}-{batch}-{method}.json")
    cmd = [sys.executable, os.path.abspath(__file__), *argv_base, "--child-out", out,
           "--workload", workload, "--batch", str(batch), "--method", method]
    if draft_folder:
        cmd += ["--draft-folder", draft_folder]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    load0, t0 = machine.loadavg(), time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not os.path.exists(out):
        return {"workload": workload, "batch": batch, "method": method,
                "error": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    with open(out) as f:
        res = json.load(f)
    res["process"] = {"pid": res.pop("pid"), "loadavg_before": load0,
                      "loadavg_after": machine.loadavg(), "wall_s": time.time() - t0}
    return res


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    from pagedjax.benchmarks.workload import agreement

    return agreement(a, b)


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(cells: list[dict]) -> None:
    print(f"\n{'workload':8} {'batch':>5} {'method':10} {'out tok/s':>9} {'vs off':>6} "
          f"{'TPOT ms':>8} {'steps':>5} {'accept':>6} {'mean len':>8} {'same as off':>11} "
          f"{'load':>5}")
    for c in cells:
        if "error" in c:
            print(f"{c['workload']:8} {c['batch']:5d} {c['method']:10} ERROR {c['error'][:80]}")
            continue
        print(f"{c['workload']:8} {c['batch']:5d} {c['method']:10} "
              f"{c['output_tokens_per_s']:9.1f} {_fmt(c.get('speedup_vs_off'), '6.2f')} "
              f"{_fmt(c['mean_tpot_ms'], '8.1f')} {c['steps']:5d} "
              f"{_fmt(c['acceptance_rate'], '6.2f')} {_fmt(c['mean_accepted_length'], '8.2f')} "
              f"{_fmt(c.get('greedy_agreement_with_off'), '11.3f')} "
              f"{c['process']['loadavg_before'][0]:5.2f}")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target (default: SmolLM2-135M GGUF)")
    ap.add_argument("--methods", default="off,ngram,draft,draft_self")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--workloads", default="repeat,random")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--draft-layers", type=int, default=24)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--input-mean", type=float, default=64.0, help="random workload")
    ap.add_argument("--batch1-requests", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=DEFAULT_JSON)
    # child side
    ap.add_argument("--child-out")
    ap.add_argument("--workload")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--method", choices=METHODS)
    ap.add_argument("--draft-folder")
    return ap.parse_args(argv)


CHILD_ONLY = ("--child-out", "--workload", "--batch", "--method", "--draft-folder", "--json")


def _base_argv(ns) -> list[str]:
    out = ["--k", str(ns.k), "--output-len", str(ns.output_len), "--input-mean",
           str(ns.input_mean), "--batch1-requests", str(ns.batch1_requests),
           "--max-model-len", str(ns.max_model_len), "--seed", str(ns.seed)]
    return out + (["--model", ns.model] if ns.model else [])


def main(argv=None) -> int:
    ns = parse_args(list(sys.argv[1:] if argv is None else argv))
    if ns.child_out:
        res = child(ns)
        with open(ns.child_out, "w") as f:
            json.dump(res, f)
        return 0
    from pagedjax.benchmarks import machine

    methods = ns.methods.split(",")
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        raise SystemExit(f"--methods: unknown {bad}; choose from {', '.join(METHODS)}")
    args = {k: v for k, v in vars(ns).items() if f"--{k.replace('_', '-')}" not in CHILD_ONLY}
    report = {"benchmark": "spec_decode", "args": args,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine.machine(), "isolation": "each cell in its own fresh process",
              "cells": []}
    with tempfile.TemporaryDirectory(prefix="pagedjax_spec_") as tmp:
        draft = None
        if "draft" in methods:
            t = time.perf_counter()
            draft = write_draft_folder(ns.model, os.path.join(tmp, "draft"), ns.draft_layers)
            report["draft"] = {"kind": f"self-speculative: the target's first {ns.draft_layers} "
                                       "layers + its final norm and LM head (float32)",
                               "build_s": time.perf_counter() - t}
        for workload in ns.workloads.split(","):
            for batch in (int(b) for b in ns.batches.split(",")):
                for method in methods:
                    print(f"{workload} batch {batch} {method} (fresh process) ...", flush=True)
                    report["cells"].append(run_cell(_base_argv(ns), workload, batch, method,
                                                    draft if method == "draft" else None, tmp))
    off = {(c["workload"], c["batch"]): c for c in report["cells"]
           if c["method"] == "off" and "error" not in c}
    for c in report["cells"]:
        base = off.get((c["workload"], c["batch"]))
        if base is not None and "error" not in c:
            c["speedup_vs_off"] = c["output_tokens_per_s"] / base["output_tokens_per_s"]
            c["greedy_agreement_with_off"] = _agreement(base["tokens"], c["tokens"])
    for c in report["cells"]:
        c.pop("tokens", None)
    report["loadavg_end"] = machine.loadavg()
    print_table(report["cells"])
    print(machine.describe(report["machine"]))
    write_json(report, ns.json)
    return 0 if all("error" not in c for c in report["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())
