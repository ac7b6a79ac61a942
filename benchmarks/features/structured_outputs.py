"""The cost of structured outputs: decode throughput with every row constrained vs none,
schema compile time (cold and cached) and the host's mask time per token.

Part 1 (throughput, real SmolLM2-135M, each arm in its own fresh process, one after
the other, same 16 chat prompts, greedy, 128 output tokens each, 16 rows a step):

* ``none``: unconstrained (``ignore_eos``: every request runs 128 tokens),
  overlapped steps (the default);
* ``none_serial``: the same with ``async_scheduling=False``: what the serial
  steps that constrained requests run cost by themselves;
* ``json``: every row constrained by a JSON schema whose documents are longer
  than 128 tokens (an object holding an array of at least 200 short strings);
* ``regex``: every row constrained by ``[A-Za-z ,.]{600,}`` (free-text-like).

Each child warms its sampler variants with a short run first, then times one
``LLM.generate`` of the 16 requests. Output tokens/s = output tokens / wall time.

Part 2 (compile and mask, this process, no model): llguidance's tokenizer view
(once per engine), then per spec the first (cold) compile and a cached compile
(median of 200 cache hits); and the mask time per token: a valid output is
tokenized and fed to a matcher token by token, timing ``GrammarState.mask``.

    python benchmarks/features/structured_outputs.py            # both parts
    python benchmarks/features/structured_outputs.py --part compile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

LONG_JSON = {"type": "object", "additionalProperties": False, "required": ["items"],
             "properties": {"items": {"type": "array", "minItems": 200, "maxItems": 200,
                                      "items": {"type": "string", "maxLength": 12}}}}
LONG_REGEX = r"[A-Za-z ,.]{600,}"
QUESTIONS = ["List fruits as JSON.", "Describe a city.", "Write about the sea.", "Name animals.",
             "Tell a story.", "Explain rain.", "List colors.", "Describe a house.",
             "Write a poem.", "Explain gravity.", "List tools.", "Describe a forest.",
             "Name countries.", "Explain music.", "List sports.", "Describe winter."]
ROWS, MAX_TOKENS = 16, 128

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
NESTED = {"type": "object", "required": ["address", "tags"],
          "properties": {"address": {"type": "object", "required": ["city", "zip"],
                                     "properties": {"city": {"type": "string"},
                                                    "zip": {"type": "string",
                                                            "pattern": "^[0-9]{5}$"}}},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}}}}
WIDE = {"type": "object", "required": [f"field_{i}" for i in range(50)],
        "properties": {f"field_{i}": ({"type": "integer"} if i % 3 == 0 else
                                      {"type": "string", "maxLength": 32} if i % 3 == 1 else
                                      {"type": "array", "items": {"type": "number"}})
                       for i in range(50)}}


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def arm_params(arm: str):
    from pagedjax import SamplingParams, StructuredOutputsParams

    if arm in ("none", "none_serial"):
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    spec = (StructuredOutputsParams(json=LONG_JSON) if arm == "json"
            else StructuredOutputsParams(regex=LONG_REGEX))
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=spec)


def child(arm: str) -> dict:
    from pagedjax import LLM

    llm = LLM(max_model_len=512, max_num_seqs=ROWS, page_size=16, seed=0,
              async_scheduling=arm != "none_serial")
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                       add_generation_prompt=True) for q in QUESTIONS[:ROWS]]
    params = arm_params(arm)
    warm = params.clone()
    warm.max_tokens = 4
    llm.generate(prompts, warm, use_tqdm=False)  # sampler variants, grammar cache
    steps0 = llm.llm_engine.num_steps
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = llm.llm_engine.num_steps - steps0
    return {"arm": arm, "wall_s": wall, "output_tokens": n_out, "steps": steps,
            "output_tok_per_s": n_out / wall, "ms_per_step": 1000 * wall / max(steps, 1),
            "finish_reasons": sorted({o.outputs[0].finish_reason for o in outs}),
            "sample_text": outs[0].outputs[0].text[:80]}


def run_child(arm: str) -> dict:
    before = loadavg()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, __file__, "--child", arm], capture_output=True,
                       text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"arm {arm} failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["loadavg_before"], res["loadavg_after"] = before, loadavg()
    return res


def _valid_text(spec) -> str:
    if spec.kind == "json":
        s = spec.json
        if s is LONG_JSON:
            return json.dumps({"items": ["word"] * 200})
        if s is PERSON:
            return json.dumps({"name": "Ada Lovelace", "age": 36})
        if s is NESTED:
            return json.dumps({"address": {"city": "Paris", "zip": "75001"}, "tags": ["a", "b"]})
        return json.dumps({f"field_{i}": (7 if i % 3 == 0 else "text" if i % 3 == 1 else [1.5])
                           for i in range(50)})
    if spec.kind == "regex":
        return "Lorem ipsum dolor sit amet, " * 25
    if spec.kind == "choice":
        return spec.choice[-1]
    return "yes"


def compile_part() -> list[dict]:
    from benchmarks.host.host_overhead import default_gguf
    from pagedjax import StructuredOutputsParams as S
    from pagedjax.structured_output.grammar import GrammarCompiler, GrammarState
    from pagedjax.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(default_gguf())
    comp = GrammarCompiler(tok, 49152, [2])
    t0 = time.perf_counter()
    comp.ll_tokenizer()
    rows = [{"spec": "llguidance tokenizer view (once per engine)",
             "cold_ms": 1000 * (time.perf_counter() - t0)}]
    specs = [("json: person (2 fields)", S(json=PERSON)), ("json: nested + enum array", S(json=NESTED)),
             ("json: 50 fields", S(json=WIDE)), ("json: 200-string array", S(json=LONG_JSON)),
             ("regex: [A-Za-z ,.]{600,}", S(regex=LONG_REGEX)),
             ("choice: 3 options", S(choice=["Paris", "London", "Berlin"])),
             ("grammar: Lark yes|no", S(grammar='start: "yes" | "no"'))]
    for name, spec in specs:
        t0 = time.perf_counter()
        compiled = comp.compile(spec)
        cold = time.perf_counter() - t0
        hits = []
        for _ in range(200):
            t0 = time.perf_counter()
            comp.compile(spec)
            hits.append(time.perf_counter() - t0)
        ids = tok.encode(_valid_text(spec), add_special_tokens=False)
        state = GrammarState(comp, compiled)
        mask_t = []
        for i in range(len(ids)):
            t0 = time.perf_counter()
            state.mask("s", ids[:i])
            mask_t.append(time.perf_counter() - t0)
        ok = state.advance("s", ids) in (None, "done")
        rows.append({"spec": name, "cold_ms": 1000 * cold,
                     "cached_us": 1e6 * statistics.median(hits),
                     "mask_us_per_token": 1e6 * statistics.mean(mask_t), "tokens_walked": len(ids),
                     "walk_valid": ok})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["all", "throughput", "compile"], default="all")
    ap.add_argument("--arms", default="none,json,none_serial,regex")
    ap.add_argument("--repeat", type=int, default=2,
                    help="rounds; odd rounds run the arms in reverse order")
    ap.add_argument("--child")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "structured_outputs.json"))
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child)))
        return 0
    from pagedjax.benchmarks.machine import machine

    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "rows": ROWS, "max_tokens": MAX_TOKENS, "loadavg_start": loadavg()}
    if a.part in ("all", "compile"):
        result["compile"] = compile_part()
        print(f"{'spec':46} {'cold ms':>9} {'cached us':>10} {'mask us/token':>14}")
        for r in result["compile"]:
            print(f"{r['spec']:46} {r['cold_ms']:9.2f} {r.get('cached_us', float('nan')):10.1f} "
                  f"{r.get('mask_us_per_token', float('nan')):14.1f}")
    if a.part in ("all", "throughput"):
        names = a.arms.split(",")
        runs = []
        for k in range(a.repeat):
            for arm in (names if k % 2 == 0 else names[::-1]):
                runs.append(dict(run_child(arm), round=k))
        result["throughput"] = runs
        med = {n: statistics.median(r["output_tok_per_s"] for r in runs if r["arm"] == n)
               for n in names}
        result["median_output_tok_per_s"] = med
        base = med.get("none", med[names[0]])
        print(f"\n{'arm':12} {'round':>5} {'out tok/s':>10} {'ms/step':>8} {'steps':>6} "
              f"{'tokens':>7}  load before/after")
        for r in runs:
            print(f"{r['arm']:12} {r['round']:5d} {r['output_tok_per_s']:10.1f} "
                  f"{r['ms_per_step']:8.1f} {r['steps']:6d} {r['output_tokens']:7d}  "
                  f"{r['loadavg_before'][0]:.2f}/{r['loadavg_after'][0]:.2f}")
        print(f"\n{'arm':12} {'median tok/s':>13} {'vs none':>8}")
        for n in names:
            print(f"{n:12} {med[n]:13.1f} {med[n] / base:8.2f}")
    result["loadavg_end"] = loadavg()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
