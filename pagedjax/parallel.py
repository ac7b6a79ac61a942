"""Tensor parallelism (one mesh axis "tp") and multi-host start-up.

Single host::

    LLM(model, tensor_parallel_size=N)       # or: pagedjax serve M -tp N

builds a ``Mesh`` over the first N devices, loads every weight straight into
its shards (host numpy slice -> one device; no device ever holds the whole
model), allocates the KV pool sharded by KV head, and jits the engine step
with the KV pool's sharding pinned. GSPMD partitions the rest; the ``xla``
attention backend needs nothing else.

Sharding rules (Megatron-style; matched on the parameter path):

    qkv_proj.kernel [H, Hkv, G+2, D]   split axis 1 (KV heads; each device gets
    qkv_proj.bias   [Hkv, G+2, D]      axis 0        whole heads with their q)
    o_proj.kernel   [Hq*D, H]          split axis 0 (row parallel, ordered by KV head)
    gate_up.kernel  [H, 2, I]          split axis 2 (column parallel)
    down.kernel     [I, H]             split axis 0 (row parallel)
    fc1 [H, I] + bias [I]              split I;  fc2 [I, H] split axis 0
    embed_tokens.embedding [V, H]      split axis 0 (vocab) when N divides V
    lm_head.kernel  [H, V]             split axis 1 (vocab) when N divides V
    everything else                    replicated (norms, biases of row-parallel
                                       layers, learned positions, OPT projections)
    KV pool [pages, 2, Hkv, page_size, D] split axis 2; int8/fp8 scales axis 2

A dimension N does not divide (intermediate size, vocabulary) is replicated
instead; KV heads must divide (``check_tensor_parallel`` names the sizes that
work).

Pallas attention under TP: a ``pallas_call`` is opaque to GSPMD, which would
gather every head onto every device. ``sharded_attention(mesh)`` wraps
``kernels_pallas.ragged_paged_attention`` in ``shard_map`` over heads (each
device runs the kernel on its own heads and KV shard). The models call the
kernel directly, so until ``models/layers.py`` routes through it the engine
runs TP with the ``xla`` backend (``auto`` resolves to ``xla`` under TP; an
explicit Pallas backend raises).

Multi-host (``jax.distributed``): every process runs the same engine on the
same inputs. Process 0 (the leader) runs the scheduler front end (API server
or ``LLM.generate``); before each ``step()`` it publishes the requests added
and aborted since the last step to the followers through the coordination
service's key-value store; followers replay them and call ``step()`` too, so
every process feeds identical host arrays to the same jitted, globally
sharded program. See ``initialize_distributed`` and ``follower_loop``.
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import json
import logging
import os
import re
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

logger = logging.getLogger("pagedjax.parallel")

AXIS = "tp"

# (path regex, axis to split or None). Paths look like "layers/3/attn/qkv_proj/kernel".
# The first matching rule wins; unmatched parameters are replicated.
SHARDING_RULES: tuple[tuple[str, int | None], ...] = (
    (r"attn/qkv_proj/kernel$", 1),
    (r"attn/qkv_proj/bias$", 0),
    (r"attn/o_proj/kernel$", 0),
    (r"attn/o_proj/bias$", None),
    (r"mlp/gate_up/kernel$", 2),
    (r"mlp/down/kernel$", 0),
    (r"mlp/down/bias$", None),
    (r"mlp/fc1/kernel$", 1),
    (r"mlp/fc1/bias$", 0),
    (r"mlp/fc2/kernel$", 0),
    (r"mlp/fc2/bias$", None),
    (r"^embed_tokens/embedding$", 0),
    (r"^lm_head/kernel$", 1),
)


# ----------------------------------------------------------------------------- mesh


def check_tensor_parallel(info, tp: int, num_devices: int | None = None) -> None:
    """ValueError unless ``tp`` devices exist and ``tp`` divides the KV heads."""
    num_devices = jax.device_count() if num_devices is None else num_devices
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    ok = [n for n in range(1, info.num_kv_heads + 1)
          if info.num_kv_heads % n == 0 and n <= num_devices]
    if tp > num_devices:
        raise ValueError(
            f"tensor_parallel_size={tp} exceeds the {num_devices} available "
            f"{jax.default_backend()} device(s) (jax.device_count()); sizes that work for "
            f"this model here: {', '.join(map(str, ok))}. On CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={tp} before jax starts")
    if info.num_kv_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} does not divide the model's num_kv_heads="
            f"{info.num_kv_heads} (num_attention_heads={info.num_q_heads}); each device must "
            f"hold whole KV heads: use one of {', '.join(map(str, ok))}")


def make_mesh(tp: int, devices: Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh named "tp" over ``devices`` (default: the first ``tp`` of jax.devices())."""
    devices = list(jax.devices() if devices is None else devices)
    if tp > len(devices):
        raise ValueError(f"tensor_parallel_size={tp} exceeds the {len(devices)} device(s) given")
    if jax.process_count() > 1 and tp != len(devices):
        raise ValueError(
            f"multi-host tensor parallelism shards over every device of every process: "
            f"tensor_parallel_size must be jax.device_count()={len(devices)}, got {tp}. "
            "For more throughput run independent replicas instead")
    return Mesh(np.array(devices[:tp]), (AXIS,))


def _path_str(path) -> str:
    parts = []
    for k in path:
        key = getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
        parts.append(str(key))
    return "/".join(parts)


def param_spec(path: str, shape: tuple[int, ...], tp: int) -> P:
    """The PartitionSpec of one parameter (see SHARDING_RULES)."""
    for pattern, axis in SHARDING_RULES:
        if re.search(pattern, path):
            if axis is None or tp == 1 or axis >= len(shape) or shape[axis] % tp:
                return P()
            spec = [None] * len(shape)
            spec[axis] = AXIS
            return P(*spec)
    return P()


def param_specs(tree, tp: int):
    """A pytree of PartitionSpecs matching ``tree`` (numpy or jax arrays)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, a: param_spec(_path_str(p), tuple(a.shape), tp), tree)


def shard_params(tree, mesh: Mesh, dtype):
    """Host numpy tree -> jax arrays laid out by ``param_specs``.

    Each device receives only its slice (``jax.make_array_from_callback`` asks
    for the addressable shards only), so a device never holds a whole tensor
    that is split, and another process's shards are never materialised here.
    """
    tp = mesh.devices.size
    np_dtype = np.dtype(jnp.dtype(dtype))
    specs = param_specs(tree, tp)

    def put(arr, spec):
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(
            tuple(arr.shape), sharding,
            lambda idx: np.ascontiguousarray(np.asarray(arr[idx]), dtype=np_dtype))

    return jax.tree_util.tree_map(put, tree, specs)


def load_sharded(model: str | None, dtype="auto", tp: int = 1, devices=None):
    """-> (model, params, mesh): ``models.load_model`` with weights loaded into shards."""
    import models
    from models import loader

    resolved = models.resolve_model(model)
    m = models.build_model(resolved, dtype)
    check_tensor_parallel(m.info, tp, len(devices) if devices is not None else None)
    mesh = make_mesh(tp, devices)
    if resolved.gguf_file:
        ckpt = loader.open_gguf(os.path.join(resolved.path, resolved.gguf_file))
    else:
        ckpt = loader.open_hf_folder(resolved.path, resolved.hf_config)
    tree = m.params_from_hf(ckpt.get)  # host numpy (memory-mapped where the format allows)
    params = shard_params(tree, mesh, m.dtype)
    del tree
    return m, params, mesh


def kv_shardings(mesh: Mesh):
    """(pages sharding, scales sharding) of one layer of the KV pool."""
    return (NamedSharding(mesh, P(None, None, AXIS, None, None)),
            NamedSharding(mesh, P(None, None, AXIS, None)))


def allocate_sharded_kv(model, mesh: Mesh, num_pages: int, page_size: int, kv_cache_dtype=None):
    """One (pages, scales|None) pair per layer, created directly in its shards."""
    import kernels_pallas

    info = model.info
    dtype = model.dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype
    if isinstance(dtype, str):
        dtype = kernels_pallas.KV_CACHE_DTYPES.get(dtype, dtype)
    dtype = jnp.dtype(dtype)
    pages_sh, scales_sh = kv_shardings(mesh)
    shape = (num_pages, 2, info.num_kv_heads, page_size, info.head_dim)
    zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=pages_sh)
    ones = jax.jit(lambda: jnp.ones(shape[:4], jnp.float32), out_shardings=scales_sh)
    quant = kernels_pallas.is_quantized(dtype)
    return tuple((zeros(), ones() if quant else None) for _ in range(info.num_layers))


def shard_runner(runner, mesh: Mesh) -> None:
    """Re-jit the runner's step and page copy with the KV pool's sharding pinned.

    Without ``out_shardings`` GSPMD may return the donated pool in another
    layout (breaking the in-place update and the 1/N memory); sampled tokens
    and logprobs come back replicated so every process can read them.
    """
    if runner.attn_backend != "xla":
        raise ValueError(
            f"attention_backend={runner.attn_backend!r} under tensor parallelism: the "
            "custom kernels (Pallas, C++) need shard_map over heads (pagedjax.parallel.sharded_attention), which "
            "the models do not route through yet; use attention_backend='xla' (what 'auto' "
            "picks under TP)")
    rep = NamedSharding(mesh, P())
    kv_sh = jax.tree_util.tree_map(lambda a: a.sharding, runner.kv_caches)
    impl = runner._step_impl  # (params, kv_caches, batch, ..., *, statics) -> (x, y, kv_caches)
    static = tuple(n for n, p in inspect.signature(impl).parameters.items()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY)
    runner._step = jax.jit(impl, static_argnames=static, donate_argnums=(1,),
                           out_shardings=(rep, rep, kv_sh))
    runner._copy = jax.jit(runner._copy_impl, donate_argnums=(0,), out_shardings=kv_sh)


def setup_engine(engine) -> None:
    """Engine hook, called at the end of ``LLMEngine.__init__`` when TP > 1 or when
    jax.distributed runs several processes."""
    if engine.mesh is None:
        raise ValueError(
            f"{jax.process_count()} processes: multi-host runs shard one model over every "
            f"device of every process; set tensor_parallel_size={jax.device_count()} "
            "(jax.device_count())")
    if engine.args.attention_backend == "auto" and engine.runner.attn_backend != "xla":
        engine.runner.attn_backend = engine.attn_backend = "xla"  # see the module docstring
    shard_runner(engine.runner, engine.mesh)
    if jax.process_count() > 1:
        attach_multihost(engine)


def sharded_attention(mesh: Mesh, axis: str = AXIS):
    """``kernels_pallas.ragged_paged_attention`` run per device on its own heads.

    q [T, Hq, D] is split on heads (q heads are ordered by KV head, so device i
    gets the query heads of its KV heads), kv_pages on axis 2, kv_scales on
    axis 2; lengths, page tables and offsets are replicated. Same signature
    and result as the unsharded call.
    """
    import kernels_pallas

    q_spec, kv_spec, s_spec = P(None, axis, None), P(None, None, axis, None, None), P(None, None, axis, None)
    rep = P()

    def attention(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, kv_scales=None,
                  **kw):
        num_seqs = jnp.asarray(num_seqs)

        if kv_scales is None:
            def body(q, kv, lens, table, cu, n):
                return kernels_pallas.ragged_paged_attention(q, kv, lens, table, cu, n, **kw)
            args, specs = (q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs), \
                (q_spec, kv_spec, rep, rep, rep, rep)
        else:
            def body(q, kv, s, lens, table, cu, n):
                return kernels_pallas.ragged_paged_attention(q, kv, lens, table, cu, n,
                                                             kv_scales=s, **kw)
            args, specs = (q, kv_pages, kv_scales, kv_lens, page_table, cu_q_lens, num_seqs), \
                (q_spec, kv_spec, s_spec, rep, rep, rep, rep)
        f = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=q_spec, check_vma=False)
        return f(*args)

    return attention


def bytes_per_device(tree) -> dict[int, int]:
    """Device id -> bytes of ``tree``'s shards held there (addressable devices only)."""
    out: dict[int, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


# ----------------------------------------------------------------------------- multi-host

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
    return {"fields": d, "eos": list(getattr(params, "_eos_token_ids", []))}


def _params_from_json(d: dict):
    from pagedjax.sampling_params import SamplingParams

    fields = dict(d["fields"])
    if fields.get("logit_bias"):
        fields["logit_bias"] = {int(k): float(v) for k, v in fields["logit_bias"]}
    p = SamplingParams(**fields)
    p._eos_token_ids = list(d["eos"])
    return p


class _Leader:
    """Wraps a leader engine's add_request / abort_request / step (instance attributes)."""

    def __init__(self, engine):
        self.engine = engine
        self.chan = _Channel()
        self.pending: list = []
        self.closed = False
        self._add, self._abort, self._step = engine.add_request, engine.abort_request, engine.step
        engine.add_request, engine.abort_request, engine.step = self.add, self.abort, self.step
        atexit.register(self.close)

    def add(self, request_id, prompt, params=None, arrival_time=None, priority=0):
        arrival = time.time() if arrival_time is None else arrival_time
        self._add(request_id, prompt, params, arrival_time=arrival, priority=priority)
        from pagedjax.sampling_params import SamplingParams

        self.pending.append(["add", request_id, prompt,
                             _params_to_json(params or SamplingParams()), arrival, priority])

    def abort(self, request_id):
        self._abort(request_id)
        self.pending.append(["abort", request_id])

    def step(self):
        self.chan.send({"ops": self.pending, "step": True})
        self.pending = []
        return self._step()

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.chan.send({"ops": self.pending, "shutdown": True})
            except Exception:  # noqa: BLE001 - the coordinator may already be gone
                logger.warning("could not tell the followers to stop")


_LEADER: _Leader | None = None


def attach_multihost(engine) -> None:
    """Process 0: publish every add/abort/step to the followers. Others: nothing
    (they are driven by ``follower_loop``)."""
    global _LEADER
    if jax.process_index() == 0:
        _LEADER = _Leader(engine)


def shutdown_followers() -> None:
    """Leader: tell the followers to leave ``follower_loop`` (also run at exit)."""
    if _LEADER is not None:
        _LEADER.close()


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


def run_follower(engine_args, warmup: bool = False) -> int:
    """Build the same engine as the leader and follow it until it stops."""
    from pagedjax.engine import LLMEngine

    engine = LLMEngine(engine_args)
    if warmup:  # the leader compiles (and runs) the same warm-up steps
        engine.runner.warmup(progress=False)
    print(f"pagedjax: process {jax.process_index()} of {jax.process_count()} follows process 0",
          file=sys.stderr, flush=True)
    steps = follower_loop(engine)
    print(f"pagedjax: process {jax.process_index()}: leader stopped; follower ran {steps} steps",
          file=sys.stderr, flush=True)
    return steps


def distributed_main(ns, coordinator_address=None, num_processes=None, process_id=None) -> int:
    """CLI entry (``pagedjax serve|generate ... --coordinator-address ...``): start
    jax.distributed; process 0 runs the command, the others follow its engine."""
    from pagedjax.config import EngineArgs
    from pagedjax.entrypoints.cli import engine_kwargs

    pid, _ = initialize_distributed(coordinator_address, num_processes, process_id)
    if pid != 0:
        if not hasattr(ns, "tensor_parallel_size"):
            raise SystemExit("multi-host runs support `pagedjax serve` and `pagedjax generate`")
        model = getattr(ns, "model", None) or getattr(ns, "model_tag", None)
        run_follower(EngineArgs(model=model, **engine_kwargs(ns)),
                     warmup=bool(getattr(ns, "warmup", False)))
        return 0
    try:
        return ns.func(ns)
    finally:
        shutdown_followers()
