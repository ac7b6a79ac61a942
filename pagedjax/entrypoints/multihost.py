"""``pagedjax serve|generate ... --coordinator-address ...``: a multi-host run.

Starts jax.distributed; process 0 runs the command, the others build the same
engine and follow it (``pagedjax.distributed.multihost``).
"""

from __future__ import annotations

import sys

import jax

from pagedjax.distributed import multihost


def distributed_main(ns, coordinator_address=None, num_processes=None, process_id=None) -> int:
    """CLI entry (``pagedjax serve|generate ... --coordinator-address ...``): start
    jax.distributed; process 0 runs the command, the others follow its engine."""
    from pagedjax.config import EngineArgs

    pid, _ = multihost.initialize_distributed(coordinator_address, num_processes, process_id)
    if pid != 0:
        if not hasattr(ns, "tensor_parallel_size"):
            raise SystemExit("multi-host runs support `pagedjax serve` and `pagedjax generate`")
        model = getattr(ns, "model", None) or getattr(ns, "model_tag", None)
        run_follower(EngineArgs.from_cli_args(ns, model=model),
                     warmup=bool(getattr(ns, "warmup", False)))
        return 0
    try:
        return ns.func(ns)
    finally:
        multihost.shutdown_followers()


def run_follower(engine_args, warmup: bool = False) -> int:
    """Build the same engine as the leader and follow it until it stops."""
    from pagedjax.engine.llm_engine import LLMEngine

    engine = LLMEngine(engine_args)
    if warmup:  # the leader compiles (and runs) the same warm-up steps
        engine.runner.warmup(progress=False)
    print(f"pagedjax: process {jax.process_index()} of {jax.process_count()} follows process 0",
          file=sys.stderr, flush=True)
    steps = multihost.follower_loop(engine)
    print(f"pagedjax: process {jax.process_index()}: leader stopped; follower ran {steps} steps",
          file=sys.stderr, flush=True)
    return steps
