"""`pagedjax` command line: generate, serve, bench."""

from __future__ import annotations

import argparse
import os
import sys

from pagedjax.distributed import multihost
from pagedjax.config import EngineArgs


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine options (from EngineArgs, the one source of truth) and multi-host flags."""
    p.add_argument("--model", default=None, help=EngineArgs.__dataclass_fields__["model"]
                   .metadata["help"])
    EngineArgs.add_cli_args(p)
    multihost.add_cli_args(p)


def cmd_generate(ns: argparse.Namespace) -> int:
    from pagedjax import LLM, SamplingParams

    args = EngineArgs.from_cli_args(ns)
    llm = LLM(**{f: getattr(args, f) for f in EngineArgs.__dataclass_fields__})
    params = SamplingParams(temperature=ns.temperature, top_p=ns.top_p, max_tokens=ns.max_tokens,
                            seed=ns.sampling_seed)
    if ns.chat:
        outs = llm.chat([{"role": "user", "content": p} for p in ns.prompt][:1], params,
                        use_tqdm=False)
    else:
        outs = llm.generate(ns.prompt, params, use_tqdm=False)
    for o in outs:
        print(f"Prompt: {o.prompt!r}\nGenerated: {o.outputs[0].text!r}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedjax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="print completions of one or more prompts")
    g.add_argument("prompt", nargs="+")
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--sampling-seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)
    try:
        from pagedjax.entrypoints import cli_extra

        cli_extra.register(sub)
    except ImportError:
        pass
    ns = parser.parse_args(argv)
    dist = [getattr(ns, k, None) for k in ("coordinator_address", "num_processes", "process_id")]
    if any(v is not None for v in dist) or any(
            os.environ.get(f"PAGEDJAX_{k}") for k in ("COORDINATOR_ADDRESS", "NUM_PROCESSES",
                                                      "PROCESS_ID", "DISTRIBUTED")):
        from pagedjax.entrypoints import multihost

        return multihost.distributed_main(ns, *dist)
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())
