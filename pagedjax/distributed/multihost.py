"""Multi-host runs (``jax.distributed``): every process runs the same engine.

Every process builds the same sharded engine and feeds identical host arrays
to the same globally sharded program. Process 0 (the leader) runs the front
end (API server or ``LLM.generate``); its engine owns a :class:`Leader` (made
by the engine at construction when ``jax.process_count() > 1``) that publishes
the requests added and aborted since the last step, before each step, through
the coordination service's key-value store. Followers replay them and step
too (:func:`follower_loop`). Nothing is patched: the engine calls
``Leader.publish_add / publish_abort / before_step`` explicitly.

The command-line entry (``pagedjax serve|generate --coordinator-address ...``)
is ``pagedjax/entrypoints/multihost.py``.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os

import jax

logger = logging.getLogger("pagedjax.distributed.multihost")

def add_cli_args(parser) -> None:
    """The multi-host flags of ``pagedjax serve|generate`` (argparse)."""
    parser.add_argument("--coordinator-address", default=None,
                        help="host:port of process 0 (multi-host; or $PAGEDJAX_COORDINATOR_ADDRESS)")
    parser.add_argument("--num-processes", type=int, default=None,
                        help="processes in the run (or $PAGEDJAX_NUM_PROCESSES)")
    parser.add_argument("--process-id", type=int, default=None,
                        help="this process, 0 = leader (or $PAGEDJAX_PROCESS_ID)")


_ENV = {"coordinator_address": "PAGEDJAX_COORDINATOR_ADDRESS",
        "num_processes": "PAGEDJAX_NUM_PROCESSES",
        "process_id": "PAGEDJAX_PROCESS_ID"}


def distributed_requested(coordinator_address=None, num_processes=None, process_id=None) -> bool:
    """True when flags or PAGEDJAX_* env vars ask for a multi-process run."""
    given = (coordinator_address, num_processes, process_id)
    return any(v is not None for v in given) or any(os.environ.get(e) for e in _ENV.values()) \
        or os.environ.get("PAGEDJAX_DISTRIBUTED", "") not in ("", "0")


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None,
                           local_device_ids=None) -> tuple[int, int]:
    """``jax.distributed.initialize`` from arguments, else PAGEDJAX_* env vars, else
    JAX's own cluster auto-detection (TPU pods, SLURM, Open MPI).

    Call before anything touches a JAX device. Returns (process_id, num_processes).
    On CPU, cross-process collectives use gloo (jax 0.10.2's default; set here
    explicitly for older versions).
    """
    coordinator_address = coordinator_address or os.environ.get(_ENV["coordinator_address"])
    if num_processes is None and os.environ.get(_ENV["num_processes"]):
        num_processes = int(os.environ[_ENV["num_processes"]])
    if process_id is None and os.environ.get(_ENV["process_id"]):
        process_id = int(os.environ[_ENV["process_id"]])
    if (num_processes is None) != (process_id is None) or (
            coordinator_address is None and num_processes is not None):
        raise ValueError("multi-host start-up needs all of --coordinator-address, "
                         "--num-processes and --process-id (or PAGEDJAX_COORDINATOR_ADDRESS, "
                         "PAGEDJAX_NUM_PROCESSES, PAGEDJAX_PROCESS_ID), or none of them on a "
                         "cluster JAX detects by itself (TPU pod, SLURM, Open MPI)")
    if num_processes is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception:  # noqa: BLE001 - a jax without the flag: its default
        pass
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               local_device_ids=local_device_ids)
    logger.info("jax.distributed: process %d of %d, %d local / %d global devices",
                jax.process_index(), jax.process_count(), jax.local_device_count(),
                jax.device_count())
    return jax.process_index(), jax.process_count()


class _Channel:
    """Leader -> followers messages through the coordination service's key-value store.

    Not a device collective: an idle follower waits in a gRPC call with a
    timeout (and retries), not in an all-reduce that could time out or spin an
    accelerator. Each message is JSON (no pickle: the coordinator port must
    never turn into code execution), split into 1 MiB chunks, one copy per
    follower, deleted by the follower that read it.
    """

    CHUNK = 1 << 20
    POLL_MS = 10_000

    def __init__(self, namespace: str = "pagedjax/ctl"):
        from jax._src import distributed as dist

        self.client = dist.global_state.client
        if self.client is None:
            raise RuntimeError("jax.distributed is not initialized")
        self.ns = namespace
        self.seq = 0

    def send(self, msg: dict) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode()
        chunks = [data[i:i + self.CHUNK] for i in range(0, len(data), self.CHUNK)] or [b""]
        for p in range(1, jax.process_count()):
            base = f"{self.ns}/{self.seq}/{p}"
            for i, c in enumerate(chunks):
                self.client.key_value_set_bytes(f"{base}/{i}", c)
            self.client.key_value_set(f"{base}/n", str(len(chunks)))  # written last
        self.seq += 1

    def recv(self) -> dict:
        base = f"{self.ns}/{self.seq}/{jax.process_index()}"
        while True:
            try:
                n = int(self.client.blocking_key_value_get(f"{base}/n", self.POLL_MS))
                break
            except Exception as e:  # noqa: BLE001 - the jaxlib error type is private
                if "DEADLINE_EXCEEDED" in str(e) or "imed out" in str(e):
                    continue  # the leader is idle: keep waiting
                raise
        data = b"".join(self.client.blocking_key_value_get_bytes(f"{base}/{i}", self.POLL_MS)
                        for i in range(n))
        for i in range(n):
            self.client.key_value_delete(f"{base}/{i}")
        self.client.key_value_delete(f"{base}/n")
        self.seq += 1
        return json.loads(data)


def _params_to_json(params) -> dict:
    d = {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.init}
    if d.get("logit_bias"):
        d["logit_bias"] = [[int(k), float(v)] for k, v in d["logit_bias"].items()]
    if d.get("structured_outputs") is not None:  # SamplingParams turns the dict back
        d["structured_outputs"] = dataclasses.asdict(d["structured_outputs"])
    # The model's EOS ids the params carry (all_stop_token_ids minus the user's own).
    eos = sorted(params.all_stop_token_ids - set(params.stop_token_ids or ()))
    return {"fields": d, "eos": eos}


def _params_from_json(d: dict):
    from pagedjax.sampling_params import SamplingParams

    fields = dict(d["fields"])
    if fields.get("logit_bias"):
        fields["logit_bias"] = {int(k): float(v) for k, v in fields["logit_bias"]}
    p = SamplingParams(**fields)
    if d["eos"]:
        p.update_from_generation_config({"eos_token_id": list(d["eos"])})
    return p


class Leader:
    """Process 0's side: publishes every add/abort before the next step.

    Created by ``LLMEngine`` itself when ``jax.process_count() > 1`` on process
    0; the engine calls these methods explicitly.
    """

    def __init__(self):
        self.chan = _Channel()
        self.pending: list = []
        self.closed = False
        atexit.register(self.close)
        _LEADERS.append(self)

    def publish_add(self, request_id, prompt, params, arrival_time, priority) -> None:
        self.pending.append(["add", request_id, prompt, _params_to_json(params), arrival_time,
                             priority])

    def publish_abort(self, request_ids) -> None:
        self.pending.append(["abort", request_ids])

    def before_step(self) -> None:
        self.chan.send({"ops": self.pending, "step": True})
        self.pending = []

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.chan.send({"ops": self.pending, "shutdown": True})
            except Exception:  # noqa: BLE001 - the coordinator may already be gone
                logger.warning("could not tell the followers to stop")


_LEADERS: list[Leader] = []


def make_leader() -> Leader | None:
    """A Leader on process 0 of a multi-process run, else None."""
    if jax.process_count() > 1 and jax.process_index() == 0:
        return Leader()
    return None


def shutdown_followers() -> None:
    """Leader: tell the followers to leave ``follower_loop`` (also run at exit)."""
    for leader in _LEADERS:
        leader.close()


def follower_loop(engine) -> int:
    """Processes 1..N-1: replay the leader's requests and steps until it stops.

    Returns the number of steps run. Raises if a replayed request fails here
    although it succeeded on the leader (the processes would diverge).
    """
    chan = _Channel()
    steps = 0
    while True:
        msg = chan.recv()
        for op in msg["ops"]:
            if op[0] == "add":
                _, rid, prompt, params, arrival, priority = op
                engine.add_request(rid, prompt, _params_from_json(params), arrival_time=arrival,
                                   priority=priority)
            elif op[0] == "abort":
                engine.abort_request(op[1])
        if msg.get("shutdown"):
            return steps
        if msg.get("step"):
            engine.step()
            steps += 1
