"""SchedulerOutput -> padded BatchInputs -> one jitted step -> sampled tokens.

Static shapes: every step is padded to one of a few buckets (``inputs.py``
says which), so only a handful of programs are ever compiled, all by
:meth:`Runner.warmup`.

The KV pool is donated to the step so XLA updates it in place. One host->device
transfer of the batch and one device->host copy of the sampled tokens per step.

Overlap: :meth:`Runner.launch` dispatches a step and returns at once (JAX
dispatch is asynchronous); :meth:`Runner.fetch` waits for its results. A row
whose token is a placeholder (-1: sampled by the step still in flight) reads
it on the device from that step's sampled tokens (``BatchInputs.token_src``),
so the next step can be dispatched before the host knows the token.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.kernels_pallas import copy_pages
from pagedjax.models.base import ExecutionPlan
from pagedjax.sample import sampler as sampler_mod
from pagedjax.worker.inputs import (  # noqa: F401
    LOGPROB_BUCKETS,
    BatchInputs,
    Buckets,
    SampleRow,
    pow2,
    prepare,
)
from pagedjax.worker.packing import PackSpec, pack, unpack
from pagedjax.worker.page_table import PageTables
from pagedjax.worker import program_store
from pagedjax.sample.sampler import RowState
from pagedjax.sample.metadata import StaticColumns
from pagedjax.utils import cdiv

@dataclasses.dataclass
class StepResult:
    token_ids: np.ndarray  # i32[R]
    logprob: np.ndarray  # f32[R]
    rank: np.ndarray  # i32[R]
    topk_ids: np.ndarray  # i32[R, K]
    topk_logprobs: np.ndarray  # f32[R, K]
    prompt_logprobs: dict[str, tuple[np.ndarray, ...]]  # request_id -> arrays for its chunk
    # request_id -> f32[chunk tokens, H]: final hidden states (SamplingParams.prompt_hidden_states)
    prompt_hidden: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Launched:
    """A dispatched step: device results not fetched yet."""

    sampled: Any  # SamplerOutput of device arrays
    plp: Any  # prompt logprob arrays or None
    tokens: jax.Array  # i32[S_MAX] sampled token of each sampling row < S_MAX (next step's source)
    cu_q_lens: np.ndarray
    row_ids: list[str]
    prompt_lp: dict[str, int]
    t0: float
    hidden: Any = None  # f32[T, H] on the device when pool_rows asked for it
    pool_rows: Any = None  # request ids whose rows' hidden states to fetch


@dataclasses.dataclass
class ModelLaunched:
    """A step whose model part is dispatched and whose sampling waits for
    ``Runner.launch_sample`` (structured outputs: a grammar row's mask needs the
    previous step's token, fetched while this step's forward runs)."""

    logits: Any  # f32[S, V] on the device
    plp: Any
    st: Any  # the SamplingTensors built at launch (numpy)
    sample_index: np.ndarray
    num_logprobs: Any
    shape: tuple
    prompt_k: Any
    cu_q_lens: np.ndarray
    row_ids: list[str]
    prompt_lp: dict[str, int]
    t0: float
    hidden: Any = None
    pool_rows: Any = None


class CompileCounter:
    """Counts programs obtained from XLA (``count``: compiled or read back from the
    persistent compilation cache or the program store), those read back
    (``cache_hits``) and so those actually compiled (:meth:`compiled`), process-wide."""

    _installed = False
    count = 0
    cache_hits = 0

    @classmethod
    def compiled(cls) -> int:
        """Programs compiled by XLA (not read back from the disk cache) so far."""
        return cls.count - cls.cache_hits

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        cls._installed = True

        def listener(event: str, duration: float, **_: Any) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                cls.count += 1

        def hits(event: str, **_: Any) -> None:
            if event == "/jax/compilation_cache/cache_hits":
                cls.cache_hits += 1

        def loaded(name: str) -> None:  # a whole program from program_store.py
            if name == "loaded":
                cls.count += 1
                cls.cache_hits += 1

        jax.monitoring.register_event_duration_secs_listener(listener)
        jax.monitoring.register_event_listener(hits)
        program_store.listeners.append(loaded)


class Runner:
    """Owns params, the KV pool and the compiled step."""

    def __init__(self, model, params, kv_caches, *, page_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, plan: ExecutionPlan,
                 sample_backend: str | None = None):
        self.model = model
        self.params = params
        self.kv_caches = kv_caches
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_pages = cdiv(max_model_len, page_size)
        self.buckets = Buckets(page_size, max_num_seqs, max_num_batched_tokens, max_model_len,
                               plan.attn_backend)
        self.max_model_len = max_model_len
        self.plan = plan
        self.attn_backend = plan.attn_backend
        self.vocab_size = model.info.vocab_size
        self.mesh = plan.mesh
        self.lora_enabled = getattr(model, "lora", None) is not None  # per-token slots in batches
        self.shapes_seen: set[tuple] = set()
        # Page-table rows kept between steps, at the widest bucket (page_table.py).
        # One set per KV group under a hybrid layout (plan.kv_layout; core/kv_groups.py).
        width, cap = self.buckets.p_buckets()[-1], 2 * max_num_seqs + 8
        self.page_tables = PageTables(width, cap) if plan.kv_layout is None else [
            PageTables(width, cap) for _ in range(1 + max(g for g, _ in plan.kv_layout))]
        # The sampling rows' static columns, reused while the batch is unchanged.
        self.sampling_columns = StaticColumns()
        # The latest steps only (bounded): launch-to-fetch seconds, and beside each
        # (decode-only, S bucket, T bucket, real rows, real tokens).
        self.step_times: collections.deque[float] = collections.deque(maxlen=1 << 16)
        self.step_shapes: collections.deque[tuple] = collections.deque(maxlen=1 << 16)
        self.num_steps = 0
        # Seconds spent inside the jitted calls' dispatch (on CPU, XLA runs a cheap
        # program inline in that call, so this is device time on the host thread).
        self.dispatch_seconds = 0.0
        self.dispatch_cpu_seconds = 0.0  # the same, CPU time of the calling thread
        self.s_max = pow2(max_num_seqs, 1)  # rows per step, padded: the token source width
        self._no_tokens = jnp.zeros(self.s_max, jnp.int32)
        self._sample_backend = sample_backend  # see sample_backend (None: resolved on use)
        # Warm-up running in the background (compile_pool.py), or None.
        self.compile_pool = None
        CompileCounter.install()
        # Two programs per step: the model (compiled per shape bucket, the
        # expensive one) and the sampler (per row bucket and feature flags,
        # cheap). Logits stay on the device between them.
        # The plan is a static argument: the compiled program depends only on
        # the arguments. Under tensor parallelism the KV pool's sharding is
        # pinned on the outputs (see sharding.step_shardings).
        step_out = copy_out = None
        if self.mesh is not None:
            from pagedjax.distributed.sharding import step_shardings

            rep, kv_sh = step_shardings(self.mesh, kv_caches)
            step_out, copy_out = (rep, rep, kv_sh), kv_sh
        self.logits_sharding = step_out[0] if step_out else None  # as the step returns them
        # Kept whole on disk (program_store.py): a warm start neither traces nor lowers.
        # Besides its arguments, the step depends on the model; the sampler also
        # on s_max (its tokens' width).
        model_fp = program_store.model_fingerprint(model)
        self._step = program_store.StoredJit(
            jax.jit(self._step_impl, static_argnames=("spec", "plan", "prompt_k", "pool"),
                    donate_argnums=(1,), out_shardings=step_out), "step", model_fp, fixed=2)
        self._sample = program_store.StoredJit(
            jax.jit(self._sample_impl, static_argnames=("spec", "num_logprobs", "backend")),
            "sample", (model_fp, self.s_max))
        self._copy = program_store.StoredJit(
            jax.jit(self._copy_impl, donate_argnums=(0,), out_shardings=copy_out), "copy", (),
            fixed=1)
        self._logits = None  # the logits head alone (logits_of), made on first use
        # Vision-language models: the encoder and image-row programs (mm_programs.py);
        # example encoder data per patch bucket, for warm-up (set by the engine).
        self.images = None
        self.encoder_examples: list = []
        if getattr(model, "is_multimodal", False):
            from pagedjax.worker.mm_programs import ImagePrograms

            self.images = ImagePrograms(model, plan, model.info.hidden_size, model.info.dtype,
                                        pool=lambda: self.compile_pool)
        # M-RoPE models: request id -> (prompt positions, delta) | None (worker/mrope.py);
        # the engine core points it at its requests.
        self.mrope_of = (lambda sid: None) if getattr(model, "uses_mrope", False) else None

    # ------------------------------------------------------------------ device
    def _step_impl(self, params, kv_caches, bufs, prev_tokens, mm=None, *, spec: PackSpec,
                   plan: ExecutionPlan, prompt_k, pool: bool = False):
        """The model part of a step: forward + logits of the rows to sample.

        bufs: the packed BatchInputs (see packing.py); prev_tokens i32[S_MAX]: the
        previous step's sampled tokens (the placeholder source).
        """
        batch: BatchInputs = unpack(bufs, spec)
        src = batch.token_src
        token_ids = jnp.where(src >= 0, prev_tokens[jnp.maximum(src, 0)], batch.token_ids)
        if mm is None:
            hidden, kv_caches = self.model.forward(params, kv_caches, token_ids, batch.meta, plan)
        else:  # (image embeddings [M, H], source i32[T]): worker/mm_inputs.py
            hidden, kv_caches = self.model.forward(params, kv_caches, token_ids, batch.meta, plan,
                                                   mm_embeds=mm)
        logits = self.model.compute_logits(params, hidden[batch.logits_index], plan)
        plp = None
        if prompt_k is not None:
            all_logits = self.model.compute_logits(params, hidden, plan)
            plp = sampler_mod.prompt_logprobs(all_logits, batch.prompt_next_ids, prompt_k)
        if pool:  # pooling rows: every token's final hidden state comes back too
            return logits, (plp, hidden.astype(jnp.float32)), kv_caches
        return logits, plp, kv_caches

    def _sample_impl(self, logits, bufs, *, spec: PackSpec, num_logprobs, backend: str):
        """logits f32[S, V] of the step's rows; bufs: the packed (SamplingTensors,
        sample_index i32[R] picking each sampling row's logits). Also returns the
        first S_MAX sampled tokens at a fixed shape (the next step's placeholder source)."""
        st, sample_index = unpack(bufs, spec)
        out = sampler_mod.sample(logits[sample_index], st, num_logprobs, backend=backend)
        n = min(self.s_max, out.token_ids.shape[0])
        tokens = jnp.zeros(self.s_max, jnp.int32).at[:n].set(out.token_ids[:n].astype(jnp.int32))
        return out, tokens

    @staticmethod
    def _copy_impl(kv_caches, src, dst):
        if isinstance(kv_caches[0], jax.Array):  # scan_layers: one stacked (pages, scales) pair
            return copy_pages(*kv_caches, src, dst, layer_axis=True)
        return tuple(copy_pages(pages, scales, src, dst) for pages, scales in kv_caches)

    def encode_item(self, data) -> jax.Array:
        """One image's encoder data (``MMItem.data``) -> its rows [R, H] on the device
        (the vision encoder: its own program per static patch bucket)."""
        return self.images.encode(self.params, data)

    def logits_of(self, hidden: np.ndarray) -> np.ndarray:
        """f32[n, H] final hidden states (a pooling request's) -> f32[n, vocab] logits, by
        the step's own logits head; rows padded to a power of two (one program each)."""
        hidden = np.asarray(hidden, np.float32)
        n = hidden.shape[0]
        padded = np.zeros((pow2(n, 1), hidden.shape[1]), np.float32)
        padded[:n] = hidden
        if self._logits is None:
            self._logits = jax.jit(self.model.compute_logits, static_argnames=("plan",))
        return np.asarray(jax.device_get(self._logits(self.params, padded, plan=self.plan)))[:n]

    def copy_pages(self, copies: Sequence[tuple[int, int]]) -> None:
        if not copies:
            return
        n = pow2(len(copies), 8)  # same buckets as rows: warmed up
        src = np.zeros(n, np.int32)
        dst = np.zeros(n, np.int32)
        for i, (s, d) in enumerate(copies):
            src[i], dst[i] = s, d
        if self.compile_pool is not None:
            self.compile_pool.need(("copy", n))
        # numpy straight into the jit (jnp.asarray would compile a staging program per shape)
        self.kv_caches = self._copy(self.kv_caches, src, dst)

    @property
    def sample_backend(self) -> str:
        """The sampler's draw ("native": the C++ sampler, or "xla"), a static argument
        of the sampler program. Resolved once, on first use rather than at
        construction: resolving waits for the C++ sampler's build."""
        if self._sample_backend is None:
            self._sample_backend = sampler_mod.resolve_backend()
        return self._sample_backend

    # ------------------------------------------------------------------ host
    def bucket_sizes(self, num_rows: int, num_tokens: int, max_pages: int, decode: bool):
        return self.buckets.bucket_sizes(num_rows, num_tokens, max_pages, decode)

    def prepare(self, rows, sample_rows: Sequence[SampleRow], prompt_lp: dict[str, int],
                prompt_tokens: dict[str, list[int]] | None = None,
                token_src: dict[str, int] | None = None, lora_slots=None):
        """Host-side padding (inputs.prepare). Returns (BatchInputs numpy pytree,
        SamplingTensors, sample_index, num_logprobs, prompt_k, (T, S, P)).
        ``lora_slots``: each row's LoRA slot (-1: none; default all -1 when LoRA is on)."""
        if self.lora_enabled and lora_slots is None:
            lora_slots = [-1] * len(rows)
        return prepare(self.buckets, rows, sample_rows, prompt_lp, prompt_tokens, token_src,
                       self.vocab_size, self.max_model_len,
                       lora_slots if self.lora_enabled else None, tables=self.page_tables,
                       columns=self.sampling_columns, mrope=self.mrope_of)

    def launch(self, rows, sample_rows: Sequence[SampleRow],
               prompt_lp: dict[str, int] | None = None,
               prompt_tokens: dict[str, list[int]] | None = None,
               prev: Launched | None = None, token_src: dict[str, int] | None = None,
               lora_slots=None, defer_sample: bool = False,
               mm: tuple | None = None, pool_rows=None) -> Launched | ModelLaunched:
        """Dispatch one step without waiting for it. ``prompt_lp`` maps request ids
        wanting prompt logprobs to k; rows with a placeholder token read it from
        ``prev``'s sampled tokens at ``token_src[request_id]``. ``defer_sample``:
        dispatch only the model; :meth:`launch_sample` dispatches the sampler.
        ``mm``: the step's image pieces (worker/mm_inputs.py step_pieces) or None."""
        prompt_lp = prompt_lp or {}
        batch, st, sample_index, num_logprobs, prompt_k, shape = self.prepare(
            rows, sample_rows, prompt_lp, prompt_tokens or {}, token_src, lora_slots)
        t0 = time.perf_counter()
        prev_tokens = prev.tokens if prev is not None else self._no_tokens
        logits, plp = self._run_model(rows, batch, prompt_k, shape, prev_tokens, mm,
                                      pool=bool(pool_rows))
        hidden = None
        if pool_rows:
            plp, hidden = plp
        pending = ModelLaunched(logits, plp, st, sample_index, num_logprobs, shape, prompt_k,
                                batch.meta.cu_q_lens,
                                [r.request_id for r in rows] if prompt_lp or pool_rows
                                else [],  # (fetch)
                                prompt_lp, t0, hidden, pool_rows)
        return pending if defer_sample else self.launch_sample(pending)

    def launch_sample(self, pending: ModelLaunched,
                      sample_rows: Sequence[SampleRow] | None = None) -> Launched:
        """Dispatch the sampler of a model-launched step; ``sample_rows`` (the same
        rows, states updated) replace the sampling state built at launch."""
        st = pending.st
        if sample_rows is not None:
            st = sampler_mod.build_sampling_tensors([sr.state for sr in sample_rows],
                                                    len(pending.sample_index), self.vocab_size,
                                                    self.max_model_len, self.sampling_columns)
        backend = self.sample_backend
        st = sampler_mod.program_flags(st, backend)  # one program where the flags change nothing
        self.shapes_seen.add((pending.shape, pending.num_logprobs, pending.prompt_k,
                              sampler_mod.variant_key(st)))
        sbufs, sspec = pack((st, pending.sample_index))
        if self.compile_pool is not None:
            self.compile_pool.need(("sampler", pending.logits.shape[0], sspec,
                                    pending.num_logprobs))
        t0, c0 = time.perf_counter(), time.thread_time()
        out, tokens = self._sample(pending.logits, sbufs, spec=sspec,
                                   num_logprobs=pending.num_logprobs, backend=backend)
        self.dispatch_seconds += time.perf_counter() - t0
        self.dispatch_cpu_seconds += time.thread_time() - c0
        return Launched(out, pending.plp, tokens, pending.cu_q_lens, pending.row_ids,
                        pending.prompt_lp, pending.t0, pending.hidden, pending.pool_rows)

    def _run_model(self, rows, batch, prompt_k, shape, prev_tokens, mm=None, pool: bool = False):
        # ``pool`` is passed only when set: the warm-up compiles the calls without it
        bbufs, bspec = pack(batch)
        if self.compile_pool is not None:
            self.compile_pool.need(("model", bspec, prompt_k))
        if self.images is not None:  # every step of a vision-language model: one program
            mm = self.images.step_inputs(mm or (), len(batch.token_ids))
        # The numpy buffers go straight into the jitted call (one copy per dtype, made by
        # jit's C++ path: cheaper than a jax.device_put first, and placed as compiled).
        t0, c0 = time.perf_counter(), time.thread_time()
        extra = () if mm is None else (mm,)  # text steps: the warmed-up program's signature
        logits, plp, self.kv_caches = self._step(self.params, self.kv_caches, bbufs, prev_tokens,
                                                 *extra, spec=bspec, plan=self.plan,
                                                 prompt_k=prompt_k,
                                                 **({"pool": True} if pool else {}))
        self.dispatch_seconds += time.perf_counter() - t0
        self.dispatch_cpu_seconds += time.thread_time() - c0
        self.num_steps += 1
        self.step_shapes.append((batch.meta.max_q_len == 1, shape[1], shape[0], len(rows),
                                 int(batch.meta.cu_q_lens[len(rows)])))  # real tokens
        return logits, plp

    def launch_logits(self, rows, prompt_lp: dict[str, int] | None = None,
                      prompt_tokens: dict[str, list[int]] | None = None, lora_slots=None):
        """Dispatch the model part of a step without sampling (speculative decoding
        verifies on its own). Returns (logits f32[L, V] on the device: row i < S is
        row i's last token, then the proposal positions (``inputs.prepare``),
        prompt logprob arrays or None, cu_q_lens, S). No placeholders."""
        prompt_lp = prompt_lp or {}
        batch, _, _, _, prompt_k, shape = self.prepare(rows, [], prompt_lp, prompt_tokens or {},
                                                       None, lora_slots)
        self.shapes_seen.add((shape, None, prompt_k, "logits"))
        logits, plp = self._run_model(rows, batch, prompt_k, shape, self._no_tokens)
        return logits, plp, batch.meta.cu_q_lens, shape[1]

    def fetch(self, launched: Launched) -> StepResult:
        """Wait for a launched step; its sampled tokens and logprobs as numpy."""
        out, plp, hidden = jax.device_get((launched.sampled, launched.plp, launched.hidden))
        self.step_times.append(time.perf_counter() - launched.t0)
        prompt_out = {}
        if plp is not None:
            cu = launched.cu_q_lens
            for i, rid in enumerate(launched.row_ids):
                if rid in launched.prompt_lp:
                    a, b = int(cu[i]), int(cu[i + 1])
                    prompt_out[rid] = tuple(np.asarray(x)[a:b] for x in plp)
        pooled = {}
        if hidden is not None:
            cu = launched.cu_q_lens
            for i, rid in enumerate(launched.row_ids):
                if rid in launched.pool_rows:
                    pooled[rid] = np.asarray(hidden)[int(cu[i]):int(cu[i + 1])]
        return StepResult(np.asarray(out.token_ids), np.asarray(out.logprob), np.asarray(out.rank),
                          np.asarray(out.topk_ids), np.asarray(out.topk_logprobs), prompt_out,
                          pooled)

    def execute(self, rows, sample_rows: Sequence[SampleRow], prompt_lp: dict[str, int] | None = None,
                prompt_tokens: dict[str, list[int]] | None = None) -> StepResult:
        """Run one step and wait for it (no placeholders)."""
        return self.fetch(self.launch(rows, sample_rows, prompt_lp, prompt_tokens))

    # ------------------------------------------------------------------ warm-up
    def warmup_shapes(self) -> list[tuple[int, int, int, bool]]:
        """Every (rows, tokens, pages, decode) combination whose bucket can occur."""
        from pagedjax.worker import warmup

        return warmup.step_shapes(self.buckets, self.max_num_seqs)

    def warmup(self, progress: bool = True, shapes=None, workers: int | None = None) -> float:
        """Compile every program a step can run, ahead of time, from ``workers``
        threads (pagedjax/worker/warmup.py); returns the seconds it took. With a
        warm-up running in the background, waits for it instead."""
        from pagedjax.worker import warmup

        if self.compile_pool is not None and shapes is None:
            t0 = time.perf_counter()
            self.compile_pool.wait()
            return time.perf_counter() - t0
        return warmup.warmup(self, progress=progress, shapes=shapes, workers=workers)

    def start_background_warmup(self, workers: int | None = None, on_done=None):
        """Compile warm-up's programs on background threads while steps run
        (``warmup.start_background``); returns the CompilePool."""
        from pagedjax.worker import warmup

        return warmup.start_background(self, workers, on_done)

    def model_compile_job(self, rows, sample_rows: Sequence[SampleRow]):
        """(key, job) for the model program a step of ``rows`` runs: ``job()``
        compiles it without running it (thread-safe: the host-side padding is
        done here, in the caller's thread) and the jitted step then reuses it."""
        batch, st, sample_index, num_logprobs, prompt_k, shape = self.prepare(
            rows, sample_rows, {}, {}, None, None)
        bbufs, bspec = pack(batch)
        args = (self.params, self.kv_caches, bbufs, self._no_tokens)
        if self.images is not None:  # as _run_model passes them
            args += (self.images.step_inputs((), len(batch.token_ids)),)
        kw = dict(spec=bspec, plan=self.plan, prompt_k=prompt_k)
        return ("model", bspec, prompt_k), lambda: self._step.compile(*args, **kw)

    def sampler_compile_job(self, num_logits: int, st, num_logprobs):
        """(key, job) for the sampler program of ``num_logits`` logits rows and the
        sampling rows ``st`` (len(st.greedy) of them); see ``model_compile_job``."""
        backend = self.sample_backend
        st = sampler_mod.program_flags(st, backend)
        rows = len(st.greedy)
        sbufs, sspec = pack((st, np.zeros(rows, np.int32)))
        logits = jax.ShapeDtypeStruct((num_logits, self.vocab_size), jnp.float32,
                                      sharding=self.logits_sharding)
        key = ("sampler", num_logits, sspec, num_logprobs)
        return key, lambda: self._sample.compile(logits, sbufs, spec=sspec,
                                                 num_logprobs=num_logprobs, backend=backend)

    def copy_compile_job(self, num_copies: int):
        """(key, job) for the page-copy program of up to ``num_copies`` copies."""
        n = pow2(num_copies, 8)
        idx = np.zeros(n, np.int32)
        return ("copy", n), lambda: self._copy.compile(self.kv_caches, idx, idx)


def make_plan(attn_backend: str, mesh=None, expert_parallel: bool = False,
              kv_layout: tuple | None = None) -> ExecutionPlan:
    """The execution plan of an engine: its backend, matmul routing and mesh.

    On the cpu_native backend, steps of at most ``native_matmul_rows`` tokens
    run their matmuls in the C++ kernel. That limit is measured once per machine
    and kernel build (kernels_pallas/cpu/matmul_rows.py: 32 rows on a 2-core
    Zen 3, 0 on a 2-core AVX-512 Xeon) or set by $PAGEDJAX_NATIVE_MATMUL_ROWS;
    prefill steps stay with XLA."""
    rows = block = 0
    int8 = None
    if attn_backend == "cpu_native" and mesh is None:
        from pagedjax.kernels_pallas.cpu import matmul_rows as cpu_matmul_rows, native as cpu_native

        if cpu_native.fast_matmul():
            rows = cpu_matmul_rows.native_matmul_rows()
        from pagedjax.worker.kernel_limits import quant_kernel_choice

        block = quant_kernel_choice("block", rows)["rows"]
        int8 = quant_kernel_choice("int8", rows)["rows"]
    return ExecutionPlan(attn_backend=attn_backend, native_matmul_rows=rows,
                         block_matmul_rows=block, int8_matmul_rows=int8, mesh=mesh,
                         expert_parallel=expert_parallel and mesh is not None,
                         kv_layout=kv_layout)


def kv_cache_bytes_per_page(info, page_size: int, dtype, layout=None) -> int:
    """Bytes of one page id: its K/V in every array of the pool (one per layer, or
    ``layout.num_slots`` under hybrid KV groups)."""
    layers = info.num_layers if layout is None else layout.num_slots
    return layers * page_size * 2 * info.num_kv_heads * info.head_dim * jnp.dtype(dtype).itemsize


def default_num_pages(info, page_size: int, kv_dtype, max_model_len: int, max_num_seqs: int,
                      budget_bytes: int, layout=None, chunk: int | None = None) -> int:
    """Pages the budget holds (capped at what max_num_seqs full-length sequences use);
    ``layout`` (core/kv_groups.py): a page then holds ``layout.num_slots`` layers."""
    per_page = kv_cache_bytes_per_page(info, page_size, kv_dtype, layout)
    n = budget_bytes // per_page
    if layout is None:
        need = max_num_seqs * math.ceil(max_model_len / page_size)
    else:
        need = max_num_seqs * layout.pages_per_seq(max_model_len, page_size,
                                                   chunk or max_model_len)
    return int(max(2, min(n, need + 1)))
