"""`pagedjax serve`, `pagedjax run-batch` and `pagedjax bench serve|throughput` (and
`bench serving`, the deprecated name of `bench serve`), registered by cli.py."""

from __future__ import annotations

import argparse
import importlib
import sys


def cmd_serve(ns: argparse.Namespace) -> int:
    from pagedjax.entrypoints.openai.api_server import run_server

    if ns.model_tag is not None:
        if ns.model is not None and ns.model != ns.model_tag:
            print("error: give the model once (positional or --model)", file=sys.stderr)
            return 2
        ns.model = ns.model_tag
    return run_server(ns)


def _passthrough(name: str):
    def run(ns: argparse.Namespace) -> int:
        mod = importlib.import_module(f"pagedjax.benchmarks.{name}")
        rc = mod.main(ns.bench_args)
        return int(rc or 0)
    return run


def _bench_serve(ns: argparse.Namespace) -> int:
    from pagedjax.benchmarks import serve

    try:
        serve.benchmark(ns)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _bench_serving(ns: argparse.Namespace) -> int:
    print("note: `pagedjax bench serving` is deprecated; use `pagedjax bench serve` (the same "
          "options)", file=sys.stderr)
    if not ns.base_url:
        ns.start_server = True
    return _bench_serve(ns)


def register(sub) -> None:
    from pagedjax.entrypoints.openai.api_server import add_server_args

    s = sub.add_parser("serve", help="start the OpenAI-compatible HTTP server",
                       description="Start the OpenAI-compatible server (/v1/completions, "
                                   "/v1/chat/completions, /v1/models, /health, /metrics).")
    s.add_argument("model_tag", nargs="?", default=None, help="model (same as --model)")
    s.add_argument("--model", default=None,
                   help="short name (SmolLM2-135M-Instruct, the default), HF folder, .gguf file "
                        "or hub id (org/name)")
    add_server_args(s)
    s.set_defaults(func=cmd_serve)

    from pagedjax.entrypoints import run_batch

    rb = sub.add_parser("run-batch", help="run an OpenAI batch file (JSONL) offline",
                        description=run_batch.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    run_batch.add_cli_args(rb)
    rb.set_defaults(func=run_batch.run_batch)

    b = sub.add_parser("bench", help="benchmarks: serve (online, any OpenAI-compatible "
                                     "server) or throughput (offline)")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    from pagedjax.benchmarks import serve as bench_serve

    bs = bsub.add_parser("serve", help="online serving benchmark against a running server "
                                       "(or one it starts)",
                         description=bench_serve.__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_serve.add_cli_args(bs)
    bs.set_defaults(func=_bench_serve)
    # The older command's name: `bench serve` with its defaults (a server started when no
    # --base-url, ShareGPT-shaped lengths, four rates, a warm-up).
    old = bsub.add_parser("serving", help="deprecated: pagedjax bench serve",
                          description="Deprecated name of `pagedjax bench serve` (same options; "
                                      "starts a server when no --base-url is given).")
    bench_serve.add_cli_args(old)
    old.set_defaults(func=_bench_serving, dataset_name="sharegpt-lengths", num_prompts=24,
                     request_rate=[0.5, 1.0, 2.0, float("inf")], warmup_prompts=4)
    name, helptext = "throughput", "offline throughput (pagedjax/benchmarks/throughput.py)"
    # prefix_chars="+": every "--option" (and --help) is handed to the script.
    p = bsub.add_parser(name, help=helptext, add_help=False, prefix_chars="+",
                        description=f"{helptext}; all options are passed to the script "
                                    "(engine options mirror LLM(...)); try --help.")
    p.add_argument("bench_args", nargs="*")
    p.set_defaults(func=_passthrough(name))
