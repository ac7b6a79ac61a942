"""SchedulerOutput -> padded BatchInputs -> one jitted step -> sampled tokens.

Static shapes: every step is padded to one of a few buckets (``inputs.py``
says which), so only a handful of programs are ever compiled, all by
:meth:`Runner.warmup`.

The KV pool is donated to the step so XLA updates it in place. One host->device
transfer of the batch and one device->host copy of the sampled tokens per step.

The engine's steps run over the persistent batch (``input_batch.py``: one row
per live sequence, its page table and sampling columns); :meth:`Runner.launch_rows`
and :meth:`Runner.execute` take rows built by hand with explicit sampling rows.
The execution plan, the KV pool's size and the compile counter are
``plan.py``; the compile jobs for warm-up are ``programs.py``.

Overlap: :meth:`Runner.launch` dispatches a step and returns at once (JAX
dispatch is asynchronous); :meth:`Runner.fetch` waits for its results. A row
whose token is a placeholder (-1: sampled by the step still in flight) reads
it on the device from that step's sampled tokens (``BatchInputs.token_src``:
the sequence's sampling row there, the batch's ``sample_pos`` column), so the
next step can be dispatched before the host knows the token.
"""

from __future__ import annotations

import collections
import operator
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pagedjax.kernels_pallas import copy_pages, live_rows
from pagedjax.models.base import ExecutionPlan
from pagedjax.sample import sampler as sampler_mod
from pagedjax.worker.input_batch import InputBatch
from pagedjax.worker.inputs import (
    BatchInputs,
    Buckets,
    SampleRow,
    logprob_bucket,
    pow2,
    prepare,
    prepare_explicit,
    row_range,
)
from pagedjax.worker.packing import PackSpec, pack, unpack
from pagedjax.worker import param_pack, program_store
from pagedjax.worker.param_pack import ParamPack
from pagedjax.worker.plan import CompileCounter
from pagedjax.worker.step_result import Launched, ModelLaunched, StepResult  # noqa: F401
from pagedjax.utils import cdiv

# How many of the latest steps' times and shapes a runner keeps (its live statistics).
STEPS_KEPT = 1 << 16

_request_id = operator.attrgetter("request_id")

class Runner:
    """Owns params, the KV pool and the compiled step."""

    def __init__(self, model, params, kv_caches, *, page_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, plan: ExecutionPlan,
                 sample_backend: str | None = None, lora_slot=None, release_params: bool = False):
        """``release_params``: the caller hands ``params`` over (packed weights are freed
        as they are copied: param_pack.py); it then uses ``runner.params``."""
        self.model = model
        self.kv_caches = kv_caches
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_pages = cdiv(max_model_len, page_size)
        self.buckets = Buckets(page_size, max_num_seqs, max_num_batched_tokens, max_model_len,
                               plan.attn_backend)
        self.max_model_len = max_model_len
        self.plan = plan
        self._param_tree = None
        self._pack = None
        self._set_params(params, release=release_params)
        self.attn_backend = plan.attn_backend
        self.vocab_size = model.info.vocab_size
        self.mesh = plan.mesh
        self.lora_enabled = getattr(model, "lora", None) is not None  # per-token slots in batches
        self.shapes_seen: set[tuple] = set()
        # The live sequences' rows (input_batch.py); page-table rows at the widest bucket,
        # one table per KV group under a hybrid layout (plan.kv_layout; core/kv_groups.py).
        num_groups = 1 if plan.kv_layout is None else 1 + max(g for g, _ in plan.kv_layout)
        self.input_batch = InputBatch(self.buckets.p_buckets()[-1], num_groups=num_groups)
        # lora_int_id -> device slot (LoRAManager.slot_of), None without LoRA.
        self.lora_slot = lora_slot
        # The latest steps only (bounded): launch-to-fetch seconds, and beside each
        # (decode-only, S bucket, T bucket, real rows, real tokens).
        self.step_times: collections.deque[float] = collections.deque(maxlen=STEPS_KEPT)
        self.step_shapes: collections.deque[tuple] = collections.deque(maxlen=STEPS_KEPT)
        self.num_steps = 0
        # Seconds spent inside the jitted calls' dispatch (on CPU, XLA runs a cheap
        # program inline in that call, so this is device time on the host thread).
        self.dispatch_seconds = 0.0
        self.dispatch_cpu_seconds = 0.0  # the same, CPU time of the calling thread
        self.s_max = pow2(max_num_seqs, 1)  # rows per step, padded: the token source width
        self.no_tokens = jnp.zeros(self.s_max, jnp.int32)
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
        # Kept whole on disk on the CPU (program_store.py): a warm
        # start then neither traces nor lowers. Besides its arguments, the step depends
        # on the model; the sampler also on s_max (its tokens' width).
        # (the pack's layout: fixed by the tree, the model and the plan)
        model_fp = (program_store.model_fingerprint(model), self._pack.key)
        stored = program_store.spans_local_devices(self.mesh.size if self.mesh else 1)
        self.step_program = program_store.StoredJit(
            jax.jit(self._step_impl, static_argnames=("spec", "plan", "prompt_k", "pool"),
                    donate_argnums=(1,), out_shardings=step_out), "step", model_fp, fixed=2,
            stored=stored)
        self.sampler_program = program_store.StoredJit(
            jax.jit(self._sample_impl, static_argnames=("spec", "num_logprobs", "backend")),
            "sample", (model_fp, self.s_max), stored=stored)
        self.copy_program = program_store.StoredJit(
            jax.jit(self._copy_impl, donate_argnums=(0,), out_shardings=copy_out), "copy", (),
            fixed=1, stored=stored)
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

    @property
    def params(self) -> dict:
        """The model's state (a pytree of arrays). Setting it (LoRA writes replace
        tables) keeps its structure; the step program takes its leaves."""
        return self._params

    @params.setter
    def params(self, params: dict) -> None:
        self._set_params(params)

    def _set_params(self, params: dict, release: bool = False) -> None:
        """``params`` and the step's ``param_args``; ``release``: packed weights are freed
        as they are copied (param_pack.py)."""
        leaves, tree = jax.tree_util.tree_flatten(params)
        if self._param_tree is not None and tree != self._param_tree:
            raise ValueError("the runner's parameters changed structure; the compiled step "
                             "programs take the old one (set arrays of the same tree)")
        if self._pack is None or not self._pack.holds(leaves):
            # The step program's first argument: a flat tuple, most weights packed in one
            # buffer on the CPU (param_pack.py: jit's dispatch costs time per argument).
            self._pack = ParamPack(leaves, self._pack_select(params), release=release)
            leaves = self._pack.leaves
            params = jax.tree_util.tree_unflatten(tree, leaves)
        self._params, self._param_tree = params, tree
        self.param_args = self._pack.args_of(leaves)

    def _pack_select(self, params) -> list[bool]:
        """Which weights to pack: on the CPU with one device only (param_pack.py)."""
        if self.plan.mesh is not None or jax.default_backend() != "cpu":
            return []
        blocks = self.plan.block_matmul_rows >= self.buckets.t_buckets()[-1]
        return param_pack.select(self.model, params, blocks)

    # ------------------------------------------------------------------ device
    def _step_impl(self, param_args, kv_caches, bufs, prev_tokens, mm=None, *, spec: PackSpec,
                   plan: ExecutionPlan, prompt_k, pool: bool = False):
        """The model part of a step: forward + logits of the rows to sample.

        param_args: the weights as ``param_args`` (param_pack.py); bufs: the packed
        BatchInputs (see packing.py); prev_tokens i32[S_MAX]: the previous step's
        sampled tokens (the placeholder source).
        """
        with self._pack.unpacked(param_args) as leaves:  # the whole trace, inside
            params = jax.tree_util.tree_unflatten(self._param_tree, leaves)
            return self._step_body(params, kv_caches, bufs, prev_tokens, mm, spec, plan,
                                   prompt_k, pool)

    def _step_body(self, params, kv_caches, bufs, prev_tokens, mm, spec, plan, prompt_k, pool):
        batch: BatchInputs = unpack(bufs, spec)
        src = batch.token_src
        token_ids = jnp.where(src >= 0, prev_tokens[jnp.maximum(src, 0)], batch.token_ids)
        # The kernels that can leave out the padding rows of the step's token and
        # sequence matrices learn how many are real (kernels_pallas/live_rows.py).
        sizes = (token_ids.shape[0], batch.logits_index.shape[0])
        with live_rows.counted(batch.meta.cu_q_lens[-1], sizes):
            return self._model_body(params, kv_caches, batch, token_ids, mm, plan, prompt_k,
                                    pool)

    def _model_body(self, params, kv_caches, batch, token_ids, mm, plan, prompt_k, pool):
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
        sample_index i32[R] picking each sampling row's logits) -> the SamplerOutput
        packed into one array (sampler.pack_output), and the first S_MAX sampled tokens
        at a fixed shape (the next step's placeholder source)."""
        st, sample_index = unpack(bufs, spec)
        out = sampler_mod.sample(logits[sample_index], st, num_logprobs, backend=backend)
        n = min(self.s_max, out.token_ids.shape[0])
        tokens = jnp.zeros(self.s_max, jnp.int32).at[:n].set(out.token_ids[:n].astype(jnp.int32))
        return sampler_mod.pack_output(out), tokens

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
        self.kv_caches = self.copy_program(self.kv_caches, src, dst)

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
                placeholder_src_of: dict[str, int] | None = None, lora_slots=None):
        """Host-side padding of rows built by hand with explicit sampling rows
        (inputs.prepare_explicit). Returns (BatchInputs numpy pytree, SamplingTensors,
        sample_index, num_logprobs, prompt_k, (T, S, P)). ``lora_slots``: each row's
        LoRA slot (-1: none; default all -1 when LoRA is on)."""
        if self.lora_enabled and lora_slots is None:
            lora_slots = [-1] * len(rows)
        return prepare_explicit(self.buckets, rows, sample_rows, prompt_lp, prompt_tokens,
                                placeholder_src_of, self.vocab_size, self.max_model_len,
                                lora_slots if self.lora_enabled else None,
                                num_groups=len(self.input_batch.page_tables),
                                mrope=self.mrope_of)

    def prepare_step(self, rows, prompt_lp: dict[str, int], placeholders: bool):
        """The model inputs of an engine step over the persistent batch: each row's
        page change applied, placeholders reading their sequence's sampling row in
        the step before. Returns (BatchInputs, (T, S, P), the rows' batch rows)."""
        ib = self.input_batch
        idx = ib.rows_of(list(map(_request_id, rows)))
        ib.apply_page_changes(rows, idx)
        lora = None
        if self.lora_enabled:
            lora = np.full(len(rows), -1, np.int32)
            if self.lora_slot is not None:
                ids = ib.lora_id[idx]
                # Each adapter once, in the order of its last row (the slots' recency).
                for lid in list(dict.fromkeys(reversed(ids.tolist())))[::-1]:
                    lora[ids == lid] = self.lora_slot(lid)
        tables = ib.page_table if len(ib.page_tables) == 1 else ib.page_tables
        batch, shape = prepare(self.buckets, rows, idx, tables,
                               placeholder_src=ib.sample_pos[idx] if placeholders else None,
                               prompt_lp=prompt_lp, prompt_tokens=ib.prompt_of, lora_slots=lora,
                               mrope=self.mrope_of)
        return batch, shape, idx

    def launch(self, rows, *, forks: Sequence[tuple[int, int]] = (),
               grammar_bits: dict[int, Any] | None = None,
               prompt_lp: dict[str, int] | None = None, prev: Launched | None = None,
               defer_sample: bool = False, mm: tuple | None = None,
               pool_rows=None) -> Launched | ModelLaunched:
        """Dispatch one engine step without waiting for it. Every row's sequence has
        a row in ``input_batch``. The sampling rows are each sampling row's first
        sample, then ``forks`` ((row index, sample index): the other samples of n > 1
        prompts); ``grammar_bits``: sampling row -> its grammar mask. ``prompt_lp``
        maps request ids wanting prompt logprobs to k; rows with a placeholder token
        read it from ``prev``'s sampled tokens. ``defer_sample``: dispatch only the
        model; :meth:`launch_sample` dispatches the sampler. ``mm``: the step's image
        pieces (worker/mm_inputs.py step_pieces) or None."""
        prompt_lp = prompt_lp or {}
        ib = self.input_batch
        batch, shape, idx = self.prepare_step(rows, prompt_lp, prev is not None)
        first, counter, fork_rows, sample_index = ib.sampling_layout(
            rows, idx, batch.meta.kv_lens, shape[1], forks)
        ib.sample_pos[first] = row_range(len(first))
        sampling = ib.step_sampling(first, counter, fork_rows, grammar_bits or {},
                                    len(sample_index), self.vocab_size, self.max_model_len)
        st = sampling.tensors()
        num_logprobs = logprob_bucket(ib.most_logprobs(first))
        prompt_k = logprob_bucket(max(prompt_lp.values())) if prompt_lp else None
        return self._dispatch(rows, batch, shape, st, sample_index, num_logprobs, prompt_k,
                              prompt_lp, prev, defer_sample, mm, pool_rows, sampling.tensors)

    def launch_rows(self, rows, sample_rows: Sequence[SampleRow],
                    prompt_lp: dict[str, int] | None = None,
                    prompt_tokens: dict[str, list[int]] | None = None,
                    prev: Launched | None = None,
                    placeholder_src_of: dict[str, int] | None = None,
                    lora_slots=None) -> Launched:
        """Dispatch a step of rows built by hand with explicit sampling rows (no
        persistent batch: each row carries its whole page list)."""
        prompt_lp = prompt_lp or {}
        batch, st, sample_index, num_logprobs, prompt_k, shape = self.prepare(
            rows, sample_rows, prompt_lp, prompt_tokens or {}, placeholder_src_of, lora_slots)
        return self._dispatch(rows, batch, shape, st, sample_index, num_logprobs, prompt_k,
                              prompt_lp, prev, False, None, None, None)

    def _dispatch(self, rows, batch, shape, st, sample_index, num_logprobs, prompt_k,
                  prompt_lp, prev, defer_sample, mm, pool_rows, resample):
        t0 = time.perf_counter()
        prev_tokens = prev.tokens if prev is not None else self.no_tokens
        logits, plp = self._run_model(rows, batch, prompt_k, shape, prev_tokens, mm,
                                      pool=bool(pool_rows))
        hidden = None
        if pool_rows:
            plp, hidden = plp
        pending = ModelLaunched(logits, plp, st, resample, sample_index, num_logprobs, shape,
                                prompt_k, batch.meta.cu_q_lens,
                                list(map(_request_id, rows)) if prompt_lp or pool_rows
                                else [],  # (fetch)
                                prompt_lp, t0, hidden, pool_rows)
        return pending if defer_sample else self.launch_sample(pending)

    def launch_sample(self, pending: ModelLaunched,
                      grammar_bits: dict[int, Any] | None = None) -> Launched:
        """Dispatch the sampler of a model-launched step; ``grammar_bits`` (sampling
        row -> mask) replace the masks it was launched with."""
        st = pending.st
        if grammar_bits is not None:
            st = pending.resample(grammar_bits)
        backend = self.sample_backend
        st = sampler_mod.program_flags(st, backend)  # one program where the flags change nothing
        self.shapes_seen.add((pending.shape, pending.num_logprobs, pending.prompt_k,
                              sampler_mod.variant_key(st)))
        sbufs, sspec = pack((st, pending.sample_index))
        if self.compile_pool is not None:
            self.compile_pool.need(("sampler", pending.logits.shape[0], sspec,
                                    pending.num_logprobs))
        t0, c0 = time.perf_counter(), time.thread_time()
        out, tokens = self.sampler_program(pending.logits, sbufs, spec=sspec,
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
        logits, plp, self.kv_caches = self.step_program(
            self.param_args, self.kv_caches, bbufs, prev_tokens, *extra, spec=bspec,
            plan=self.plan, prompt_k=prompt_k, **({"pool": True} if pool else {}))
        self.dispatch_seconds += time.perf_counter() - t0
        self.dispatch_cpu_seconds += time.thread_time() - c0
        self.num_steps += 1
        self.step_shapes.append((batch.meta.max_q_len == 1, shape[1], shape[0], len(rows),
                                 int(batch.meta.cu_q_lens[len(rows)])))  # real tokens
        return logits, plp

    def launch_logits(self, rows, prompt_lp: dict[str, int] | None = None):
        """Dispatch the model part of an engine step without sampling (speculative
        decoding verifies on its own). Returns (logits f32[L, V] on the device: row
        i < S is row i's last token, then the proposal positions (``inputs.prepare``),
        prompt logprob arrays or None, cu_q_lens, S). No placeholders."""
        prompt_lp = prompt_lp or {}
        batch, shape, _ = self.prepare_step(rows, prompt_lp, False)
        prompt_k = logprob_bucket(max(prompt_lp.values())) if prompt_lp else None
        self.shapes_seen.add((shape, None, prompt_k, "logits"))
        logits, plp = self._run_model(rows, batch, prompt_k, shape, self.no_tokens)
        return logits, plp, batch.meta.cu_q_lens, shape[1]

    def fetch(self, launched: Launched) -> StepResult:
        """Wait for a launched step; its sampled tokens and logprobs as numpy."""
        packed, plp, hidden = jax.device_get((launched.sampled, launched.plp, launched.hidden))
        self.step_times.append(time.perf_counter() - launched.t0)
        return StepResult.of(launched, sampler_mod.unpack_output(packed), plp, hidden)

    def execute(self, rows, sample_rows: Sequence[SampleRow], prompt_lp: dict[str, int] | None = None,
                prompt_tokens: dict[str, list[int]] | None = None) -> StepResult:
        """Run one step of rows built by hand and wait for it (no placeholders)."""
        return self.fetch(self.launch_rows(rows, sample_rows, prompt_lp, prompt_tokens))

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
