"""``pagedjax serve|generate ... --coordinator-address ...``: a multi-host run.

Starts jax.distributed; process 0 runs the command, the others build the same
engine and follow it (``pagedjax.multihost``).
"""

from __future__ import annotations

from pagedjax import multihost


def distributed_main(ns, coordinator_address=None, num_processes=None, process_id=None) -> int:
    """CLI entry (``pagedjax serve|generate ... --coordinator-address ...``): start
    jax.distributed; process 0 runs the command, the others follow its engine."""
    from pagedjax.config import EngineArgs
    from pagedjax.entrypoints.cli import engine_kwargs

    pid, _ = multihost.initialize_distributed(coordinator_address, num_processes, process_id)
    if pid != 0:
        if not hasattr(ns, "tensor_parallel_size"):
            raise SystemExit("multi-host runs support `pagedjax serve` and `pagedjax generate`")
        model = getattr(ns, "model", None) or getattr(ns, "model_tag", None)
        multihost.run_follower(EngineArgs(model=model, **engine_kwargs(ns)),
                     warmup=bool(getattr(ns, "warmup", False)))
        return 0
    try:
        return ns.func(ns)
    finally:
        multihost.shutdown_followers()
