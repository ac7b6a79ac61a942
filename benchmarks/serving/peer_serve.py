"""``pagedjax bench serve`` against pagedjax's server and llama.cpp's, side by side.

    python benchmarks/serving/peer_serve.py --llama-server PATH/llama-server \\
        --num-prompts 32 --random-input-len 64 --random-output-len 32 --rounds 2

Both servers serve the same GGUF file (default: SmolLM2-135M-Instruct Q4_1, the
default model) with the same batch width: ``pagedjax serve --max-num-seqs P``
and ``llama-server -c P*CTX --parallel P -cb -t THREADS``. Each round starts
every server in a fresh process, warms it with a few requests, runs the same
requests against it (``pagedjax.benchmarks.serve``: streamed completions,
``ignore_eos``, token counts from the server's ``usage``) and stops it; the
order alternates between rounds. Reported per server: the median over rounds
of vLLM's figures, and per round the ratio pagedjax / llama.cpp of each, which
is what to quote on a shared machine (the load average is recorded around
every run). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.serving import llama_server  # noqa: E402
from pagedjax.benchmarks import serve  # noqa: E402
from pagedjax.benchmarks.serve_server import free_port, pagedjax_command, start, stop  # noqa: E402
from pagedjax.benchmarks.throughput import write_json  # noqa: E402

NAME = "SmolLM2-135M-Instruct"
FIGURES = [("request_throughput", "req/s", 1), ("output_throughput", "out tok/s", 1),
           ("median_ttft_ms", "median TTFT ms", -1), ("median_tpot_ms", "median TPOT ms", -1),
           ("median_itl_ms", "median ITL ms", -1), ("median_e2el_ms", "median E2EL ms", -1)]


def commands(ns, port: int) -> dict[str, list[str]]:
    """Each server's command line, same model, batch width and per-request context."""
    return {
        "pagedjax": pagedjax_command(port, f"--model {ns.model} --served-model-name {NAME} "
                                           f"--max-num-seqs {ns.parallel} --max-model-len "
                                           f"{ns.ctx} --log-level warning --disable-ui"),
        "llama.cpp": llama_server.command(ns.llama_server, ns.model, port, slots=ns.parallel,
                                          ctx=ns.ctx, threads=ns.threads, alias=NAME),
    }


def bench_args(ns, url: str, label: str, num_prompts: int, seed: int) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve.add_cli_args(p)
    argv = ["--base-url", url, "--label", label, "--model", NAME, "--num-prompts",
            str(num_prompts), "--random-input-len", str(ns.random_input_len),
            "--random-output-len", str(ns.random_output_len), "--random-range-ratio",
            str(ns.random_range_ratio), "--seed", str(seed), "--disable-tqdm"]
    if ns.max_concurrency:
        argv += ["--max-concurrency", str(ns.max_concurrency)]
    if ns.request_rate:
        argv += ["--request-rate", str(ns.request_rate)]
    return p.parse_args(argv)


def run_one(ns, system: str, tmp: str, rnd: int) -> dict:
    """Start ``system`` fresh, warm it, benchmark it, stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = os.path.join(tmp, f"{system}-{rnd}.log")
    t0 = time.time()
    proc = start(commands(ns, port)[system], url, ns.start_timeout, log)
    try:
        started_s = time.time() - t0
        serve.benchmark(bench_args(ns, url, system, ns.warmup_prompts, 10_000 + rnd))
        load0 = os.getloadavg()
        rep = serve.benchmark(bench_args(ns, url, system, ns.num_prompts, ns.seed))
        rep["loadavg_before"], rep["loadavg_after"] = load0, os.getloadavg()
        rep["start_s"] = started_s
    finally:
        stop(proc)
    for k in ("input_lens", "output_lens", "ttfts", "e2els"):
        rep.pop(k, None)
    return rep


def compare(rounds: list[dict]) -> dict:
    """Per server the median of each figure over rounds; per round pagedjax / llama.cpp."""
    out = {"median": {}, "ratio_per_round": []}
    for system in ("pagedjax", "llama.cpp"):
        out["median"][system] = {k: statistics.median(r[system][k] for r in rounds)
                                 for k, _, _ in FIGURES}
    for r in rounds:
        out["ratio_per_round"].append({k: r["pagedjax"][k] / r["llama.cpp"][k]
                                       if r["llama.cpp"][k] else None for k, _, _ in FIGURES})
    out["ratio_median"] = {k: statistics.median(x[k] for x in out["ratio_per_round"])
                           for k, _, _ in FIGURES}
    return out


def table(cmp: dict, rounds: list[dict]) -> str:
    head = f"{'':<26}" + "".join(f"{h:>16}" for _, h, _ in FIGURES)
    lines = [head, "-" * len(head)]
    for system, figs in cmp["median"].items():
        lines.append(f"{system + ' (median)':<26}" +
                     "".join(f"{figs[k]:>16.2f}" for k, _, _ in FIGURES))
    for i, rat in enumerate(cmp["ratio_per_round"]):
        order = " then ".join(rounds[i]["order"])
        lines.append(f"{'pagedjax/llama r' + str(i + 1):<26}" +
                     "".join(f"{rat[k]:>15.2f}x" for k, _, _ in FIGURES) + f"   ({order})")
    lines.append(f"{'pagedjax/llama median':<26}" +
                 "".join(f"{cmp['ratio_median'][k]:>15.2f}x" for k, _, _ in FIGURES))
    lines.append("(throughput: higher is better; latencies: lower is better)")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    llama_server.add_args(p)
    p.add_argument("--rounds", type=int, default=2, help="order alternates between rounds")
    p.add_argument("--parallel", type=int, default=16, help="batch width of both servers")
    p.add_argument("--ctx", type=int, default=256, help="context per request")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--warmup-prompts", type=int, default=4)
    p.add_argument("--random-input-len", type=int, default=64)
    p.add_argument("--random-output-len", type=int, default=32)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--request-rate", type=float, default=None, help="default: all at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--json", default=os.path.join("benchmarks", "results", "peer_serve.json"))
    ns = p.parse_args(argv)
    llama_server.resolve_args(p, ns, needed=True)
    ns.model = ns.gguf
    return ns


def main(argv=None) -> int:
    ns = parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="peer_serve_") as tmp:
        for rnd in range(ns.rounds):
            order = ["pagedjax", "llama.cpp"][::1 if rnd % 2 == 0 else -1]
            rd = {"order": order}
            for system in order:
                print(f"[round {rnd + 1}/{ns.rounds}] {system} (fresh process)", flush=True)
                rd[system] = run_one(ns, system, tmp, rnd)
            rounds.append(rd)
    cmp = compare(rounds)
    print(table(cmp, rounds))
    report = {"benchmark": "peer_serve", "args": vars(ns), "cpus": os.cpu_count(),
              "commands": commands(ns, 0), "rounds": rounds, "comparison": cmp}
    write_json(report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
