"""`pagedjax` command line: generate, serve, bench."""

from __future__ import annotations

import argparse
import os
import sys

from pagedjax.config import EngineArgs


def add_engine_args(p: argparse.ArgumentParser, with_model: bool = True) -> None:
    """Engine options mirrored from LLM(...)."""
    d = EngineArgs()
    if with_model:
        p.add_argument("--model", default=None,
                       help="short name (SmolLM2-135M-Instruct, the default), HF folder or .gguf file")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--page-size", type=int, default=d.page_size)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    p.add_argument("--cpu-kv-cache-gib", type=float, default=d.cpu_kv_cache_gib)
    p.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--attention-backend", default=d.attention_backend,
                   choices=["auto", "xla", "cpu_native", "pallas_gpu", "pallas_tpu"])
    p.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, choices=["auto", "int8", "fp8"])
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size)
    p.add_argument("--scheduling-policy", default=d.scheduling_policy, choices=["fcfs", "priority"])
    # Multi-host tensor parallelism (jax.distributed); see pagedjax/multihost.py.
    p.add_argument("--coordinator-address", default=None,
                   help="host:port of process 0 (multi-host; or $PAGEDJAX_COORDINATOR_ADDRESS)")
    p.add_argument("--num-processes", type=int, default=None,
                   help="processes in the run (or $PAGEDJAX_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, default=None,
                   help="this process, 0 = leader (or $PAGEDJAX_PROCESS_ID)")


def engine_kwargs(ns: argparse.Namespace) -> dict:
    keys = [f for f in EngineArgs.__dataclass_fields__ if f != "model" and hasattr(ns, f)]
    return {k: getattr(ns, k) for k in keys}


def cmd_generate(ns: argparse.Namespace) -> int:
    from pagedjax import LLM, SamplingParams

    llm = LLM(ns.model, **engine_kwargs(ns))
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
