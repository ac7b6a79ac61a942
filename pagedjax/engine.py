"""LLMEngine: add_request / step / abort — the scheduler, runner and text side joined.

One ``step()``: schedule -> copy-on-write page copies -> one device step ->
scheduler update -> incremental detokenization and stop strings ->
``RequestOutput`` for every request that changed. Not thread-safe: the server
drives it from one engine thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Sequence

import jax
import numpy as np

from pagedjax.config import EngineArgs, default_cache_dir
from pagedjax.outputs import (CompletionOutput, RequestMetrics, RequestOutput,
                              make_logprobs_dict)
from pagedjax.request import Request
from pagedjax import multihost
from pagedjax.runner import Runner, SampleRow, default_num_pages, make_plan
from pagedjax.sampler import RowState
from pagedjax.sampling_params import SamplingParams
from pagedjax.scheduler import Scheduler


def _enable_compilation_cache(path: str | None) -> None:
    """Persist compiled XLA programs so the next start-up skips most compiles."""
    try:
        cache = path or f"{default_cache_dir()}/xla"
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except Exception:  # noqa: BLE001 - an old jax without these flags: run uncached
        pass


@dataclasses.dataclass
class _Seq:
    """One of a request's n output sequences (text side)."""

    index: int
    detok: Any
    stop: Any
    params: SamplingParams
    text: str = ""
    token_ids: list = dataclasses.field(default_factory=list)
    cumulative_logprob: float = 0.0
    logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: Any = None


@dataclasses.dataclass
class _ReqState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: dict[int, _Seq]
    metrics: RequestMetrics
    fallback_seed: int
    bad_words_ids: list
    prompt_logprobs: list | None = None
    num_cached_tokens: int = 0
    finished: bool = False


class LLMEngine:
    """The engine behind ``LLM`` and the server."""

    def __init__(self, args: EngineArgs):
        import models
        from pagedjax import tokenizer as tok_mod
        from kernels_pallas import KV_CACHE_DTYPES

        args.validate()
        self.args = args
        _enable_compilation_cache(args.compilation_cache_dir)
        self.resolved = models.resolve_model(args.model)
        self.model_name = args.model or models.DEFAULT_MODEL
        if jax.process_count() > 1 and args.tensor_parallel_size != jax.device_count():
            raise ValueError(
                f"{jax.process_count()} processes: multi-host runs shard one model over every "
                f"device of every process; set tensor_parallel_size={jax.device_count()} "
                "(jax.device_count())")
        if args.tensor_parallel_size > 1:
            from pagedjax import sharding

            self.model, self.params, self.mesh = sharding.load_sharded(
                args.model, args.dtype, args.tensor_parallel_size)
        else:
            self.model, self.params = models.load_model(args.model, dtype=args.dtype)
            self.mesh = None
        info = self.model.info
        self.info = info
        tok_src = args.tokenizer or self.resolved.tokenizer_source
        tok_kwargs = {} if args.tokenizer else dict(self.resolved.tokenizer_kwargs)
        self.tokenizer = tok_mod.load_tokenizer(tok_src, **tok_kwargs)
        self.max_model_len = args.max_model_len or min(info.max_model_len, 2048)
        if self.max_model_len > info.max_model_len:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's limit "
                             f"{info.max_model_len}; lower max_model_len")
        mnbt = args.max_num_batched_tokens or max(512, min(2048, args.max_num_seqs))
        if args.kv_cache_dtype == "auto":
            kv_dtype = info.dtype
        else:
            kv_dtype = KV_CACHE_DTYPES[args.kv_cache_dtype]
        num_pages = args.num_pages
        if num_pages is None:
            budget = int(args.cpu_kv_cache_gib * 2**30)
            if jax.default_backend() != "cpu":
                stats = jax.devices()[0].memory_stats() or {}
                limit = stats.get("bytes_limit", 0)
                used = stats.get("bytes_in_use", 0)
                if limit:
                    budget = int(limit * args.gpu_memory_utilization) - used
            num_pages = default_num_pages(info, args.page_size, kv_dtype, self.max_model_len,
                                          args.max_num_seqs, budget)
        self.num_pages = num_pages
        if args.tensor_parallel_size > 1:
            from pagedjax import sharding

            kv = sharding.allocate_sharded_kv(self.model, self.mesh, num_pages, args.page_size,
                                              None if args.kv_cache_dtype == "auto" else kv_dtype)
        else:
            kv = self.model.allocate_kv_caches(
                num_pages, args.page_size, None if args.kv_cache_dtype == "auto" else kv_dtype)
        if (args.scan_layers and self.mesh is None and hasattr(self.model, "can_scan")
                and self.model.can_scan()):
            self.params = self.model.stack_params(self.params)
            kv = self.model.stack_kv_caches(kv)
        self.attn_backend = self._resolve_backend(args.attention_backend)
        self.scheduler = Scheduler(num_pages, args.page_size, args.max_num_seqs, mnbt,
                                   self.max_model_len,
                                   enable_prefix_caching=args.enable_prefix_caching,
                                   policy=args.scheduling_policy)
        self.runner = Runner(self.model, self.params, kv, page_size=args.page_size,
                             max_num_seqs=args.max_num_seqs, max_num_batched_tokens=mnbt,
                             max_model_len=self.max_model_len,
                             plan=make_plan(self.attn_backend, self.mesh))
        # Multi-host: process 0 publishes its requests to the followers before each step.
        self._leader = multihost.make_leader()
        self.eos_token_ids = tuple(info.eos_token_ids) or (
            (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ())
        self._states: dict[str, _ReqState] = {}
        self._seq_of: dict[str, tuple[str, int]] = {}  # scheduler id -> (request id, index)
        self._rng = np.random.default_rng(args.seed)
        self._counter = itertools.count()
        self.num_steps = 0
        self.num_generated_tokens = 0
        self.num_prompt_tokens = 0
        self.finished_metrics: list[RequestMetrics] = []
        self._beam_roots: set[str] = set()  # requests driven by beam_search.py
        self._beam_logprobs: dict[str, dict[int, float]] = {}

    def _resolve_backend(self, requested: str) -> str:
        """``auto`` under tensor parallelism on CPU is ``xla`` (GSPMD partitions it;
        the C++ kernels would need shard_map too); elsewhere the platform's kernel,
        per device through shard_map under TP."""
        from kernels_pallas import resolve_backend

        if requested == "auto" and self.mesh is not None and jax.default_backend() == "cpu":
            return "xla"
        return resolve_backend(requested)

    # ------------------------------------------------------------------ requests
    def tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """str, list of token ids, or {"prompt": ...} / {"prompt_token_ids": [...]}."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            prompt = prompt.get("prompt")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
            return prompt, list(ids)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in prompt):
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.info.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be in [0, {self.info.vocab_size}), "
                                 f"got {bad[:5]}")
            return None, ids
        raise ValueError("prompt must be a string, a list of token ids, or a dict with "
                         f"'prompt' or 'prompt_token_ids'; got {type(prompt).__name__}")

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0) -> None:
        """Validate and queue one request. Raises ValueError before any work starts."""
        from pagedjax import tokenizer as tok_mod

        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        if request_id in self._states:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self.tokenize(prompt)
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens but max_model_len is "
                             f"{self.max_model_len}, which must also leave room for at least "
                             "one output token; shorten the prompt or raise max_model_len")
        arrival = time.time() if arrival_time is None else arrival_time
        bad_ids = tok_mod.bad_words_token_ids(self.tokenizer, params.bad_words) \
            if params.bad_words else []
        seqs = {}
        for i in range(params.n):
            p = params
            if params.seed is not None and i > 0:
                p = params.clone()
                p.seed = (params.seed + i) % (2**63)
            seqs[i] = _Seq(
                index=i,
                detok=tok_mod.IncrementalDetokenizer(
                    self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens,
                    spaces_between_special_tokens=params.spaces_between_special_tokens),
                stop=tok_mod.StopChecker(params.stop or [], params.include_stop_str_in_output),
                params=p, logprobs=[] if params.logprobs is not None else None)
        state = _ReqState(request_id=request_id, prompt=text, prompt_token_ids=ids, params=params,
                          seqs=seqs, metrics=RequestMetrics(arrival_time=arrival,
                                                            last_token_time=arrival),
                          fallback_seed=int(self._rng.integers(0, 2**31 - 1)),
                          bad_words_ids=bad_ids,
                          prompt_logprobs=[None] if params.prompt_logprobs is not None else None)
        # Prompt logprobs need every prompt position computed: a unique salt keeps
        # the prefix cache from skipping any of them.
        salt = f"plp-{request_id}-{next(self._counter)}" if params.prompt_logprobs is not None else None
        req = Request(request_id, ids, params, eos_token_ids=self.eos_token_ids,
                      arrival_time=arrival, priority=priority, max_model_len=self.max_model_len,
                      cache_salt=salt)
        self.scheduler.add_request(req)  # raises ValueError on a bad request
        if self._leader is not None:
            self._leader.publish_add(request_id, prompt, params, arrival, priority)
        self._states[request_id] = state
        self._seq_of[request_id] = (request_id, 0)
        self.num_prompt_tokens += len(ids)

    def abort_request(self, request_id: str | Sequence[str]) -> None:
        """Abort requests at any time; their pages are freed at once."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self._leader is not None:
            self._leader.publish_abort(ids)
        for rid in ids:
            state = self._states.pop(rid, None)
            if state is None:
                continue
            for sid in self._sched_ids(rid):
                self.scheduler.abort_request(sid)
                self._seq_of.pop(sid, None)

    def _sched_ids(self, rid: str) -> list[str]:
        """Scheduler ids of a request's sequences (the scheduler names n > 1 children)."""
        return [sid for sid, (r, _) in self._seq_of.items() if r == rid]

    def has_unfinished_requests(self) -> bool:
        return bool(self._states)

    def get_num_unfinished_requests(self) -> int:
        return len(self._states)

    def request_ids(self) -> list[str]:
        """Ids of every unfinished request (waiting or running)."""
        return list(self._states)

    def scheduled_request_ids(self) -> list[str]:
        """Ids of unfinished requests that have been scheduled at least once."""
        return [rid for rid, st in self._states.items()
                if st.metrics.first_scheduled_time is not None]

    # ------------------------------------------------------------------ step
    def _row_state(self, req: Request, seq: _Seq, state: _ReqState, fork_index: int | None):
        params = seq.params
        outputs = req.output_token_ids if fork_index is None else []
        return RowState(params=params, prompt_token_ids=req.prompt_token_ids,
                        output_token_ids=outputs,
                        fallback_seed=(state.fallback_seed + 7919 * seq.index) % (2**31 - 1),
                        eos_token_ids=self.eos_token_ids,
                        bad_words_token_ids=state.bad_words_ids)

    def step(self) -> list[RequestOutput]:
        """Run one scheduling + device step; return outputs of requests that changed.

        Outputs are cumulative: each CompletionOutput holds the whole text and
        token ids so far (a stop-string prefix still being matched is held back).
        """
        if self._leader is not None:
            self._leader.before_step()
        out = self.scheduler.schedule()
        if not out.rows:
            return []
        now = time.time()
        self.runner.copy_pages(out.page_copies)
        sample_rows: list[SampleRow] = []
        targets: list[tuple[str, str, int]] = []  # (scheduler id, request id, seq index)
        prompt_lp: dict[str, int] = {}
        prompt_tokens: dict[str, list[int]] = {}
        for i, row in enumerate(out.rows):
            req = self.scheduler.get_request(row.request_id)
            rid, idx = self._seq_of[row.request_id]
            state = self._states[rid]
            if req is not None:
                state.num_cached_tokens = max(state.num_cached_tokens, req.num_cached_tokens)
            if state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = now
                state.metrics.time_in_queue = now - state.metrics.arrival_time
            if state.params.prompt_logprobs is not None and row.start_pos < len(state.prompt_token_ids):
                prompt_lp[row.request_id] = state.params.prompt_logprobs
                prompt_tokens[row.request_id] = state.prompt_token_ids
            if row.num_samples == 0:
                continue
            if row.num_samples == 1:
                seq = state.seqs[idx]
                sample_rows.append(SampleRow(row.request_id, i, self._row_state(req, seq, state, None),
                                             seq.params.logprobs))
                targets.append((row.request_id, rid, idx))
            else:
                for j in range(row.num_samples):
                    seq = state.seqs[j]
                    sample_rows.append(SampleRow(row.request_id, i,
                                                 self._row_state(req, seq, state, j),
                                                 seq.params.logprobs))
                    targets.append((row.request_id, rid, j))
        res = self.runner.execute(out.rows, sample_rows, prompt_lp, prompt_tokens)
        self.num_steps += 1
        sampled: dict[str, list[int]] = {}
        for j, (sid, rid, idx) in enumerate(targets):
            tok = int(res.token_ids[j])
            sampled.setdefault(sid, []).append(tok)
            state = self._states[rid]
            seq = state.seqs[idx]
            seq.cumulative_logprob += float(res.logprob[j])
            if rid in self._beam_roots:
                k = seq.params.logprobs
                self._beam_logprobs[sid] = {int(t): float(v) for t, v in
                                            zip(res.topk_ids[j][:k], res.topk_logprobs[j][:k])}
                continue
            if seq.logprobs is not None:
                k = seq.params.logprobs
                seq.logprobs.append(make_logprobs_dict(
                    tok, float(res.logprob[j]), int(res.rank[j]), res.topk_ids[j][:k],
                    res.topk_logprobs[j][:k], self._decode_one))
        for sid, arrays in res.prompt_logprobs.items():
            self._add_prompt_logprobs(sid, out, arrays)
        changed = self.scheduler.update(out, sampled)
        touched: dict[str, _ReqState] = {}
        now = time.time()
        for req in changed:
            if req.parent_id is not None and req.request_id not in self._seq_of:
                parent_rid, _ = self._seq_of.get(req.parent_id, (req.parent_id, 0))
                self._seq_of[req.request_id] = (parent_rid, req.sample_index)
            ref = self._seq_of.get(req.request_id)
            if ref is None:
                continue
            rid, idx = ref
            state = self._states.get(rid)
            if state is None:
                continue
            seq = state.seqs[idx]
            new = req.output_token_ids[len(seq.token_ids):]
            if new:
                self._append_tokens(state, seq, req, new, now)
            if req.is_finished and seq.finish_reason is None:
                seq.finish_reason = req.finish_reason
                seq.stop_reason = req.stop_reason
                if seq.params.detokenize and seq.stop.stopped is None:
                    seq.stop.add(seq.detok.flush())
                seq.text = seq.stop.text
            touched[rid] = state
        outputs = []
        for rid, state in touched.items():
            done = all(s.finish_reason is not None for s in state.seqs.values())
            if done:
                state.finished = True
                state.metrics.finished_time = now
                self.finished_metrics.append(state.metrics)
                self._states.pop(rid, None)
                for sid in self._sched_ids(rid):
                    self._seq_of.pop(sid, None)
            outputs.append(self._make_output(state))
        return outputs

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _append_tokens(self, state: _ReqState, seq: _Seq, req: Request, new: list[int], now: float):
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = now
        state.metrics.last_token_time = now
        self.num_generated_tokens += len(new)
        for tok in new:
            seq.token_ids.append(tok)
            if seq.finish_reason is not None:
                continue
            delta = seq.detok.add([tok]) if seq.params.detokenize else ""
            matched = seq.stop.add(delta)
            if matched is not None:
                seq.finish_reason = "stop"
                seq.stop_reason = matched
                if not req.is_finished:
                    self.scheduler.finish_request(req.request_id, "stop", matched)
                break  # tokens past the stop string are dropped
        seq.text = seq.stop.text if seq.finish_reason else seq.stop.text[:seq.stop.num_safe_chars]
        if seq.finish_reason is not None and len(seq.token_ids) > len(req.output_token_ids):
            seq.token_ids = seq.token_ids[:len(req.output_token_ids)]

    def _add_prompt_logprobs(self, sid: str, out, arrays) -> None:
        ref = self._seq_of.get(sid)
        if ref is None:
            return
        state = self._states[ref[0]]
        if state.prompt_logprobs is None:
            return
        row = next(r for r in out.rows if r.request_id == sid)
        lp, rank, tk_ids, tk_lp = arrays
        k = state.params.prompt_logprobs
        prompt = state.prompt_token_ids
        for j in range(len(row.token_ids)):
            pos = row.start_pos + j + 1  # the token whose logprob this is
            if pos >= len(prompt) or pos < len(state.prompt_logprobs):
                continue
            state.prompt_logprobs.append(make_logprobs_dict(
                prompt[pos], float(lp[j]), int(rank[j]), tk_ids[j][:k], tk_lp[j][:k],
                self._decode_one))

    def _make_output(self, state: _ReqState) -> RequestOutput:
        outs = []
        for i in sorted(state.seqs):
            s = state.seqs[i]
            outs.append(CompletionOutput(
                index=i, text=s.text, token_ids=list(s.token_ids),
                cumulative_logprob=s.cumulative_logprob if s.logprobs is not None else None,
                logprobs=list(s.logprobs) if s.logprobs is not None else None,
                finish_reason=s.finish_reason, stop_reason=s.stop_reason))
        return RequestOutput(request_id=state.request_id, prompt=state.prompt,
                             prompt_token_ids=state.prompt_token_ids,
                             prompt_logprobs=state.prompt_logprobs, outputs=outs,
                             finished=state.finished, metrics=dataclasses.replace(state.metrics),
                             num_cached_tokens=state.num_cached_tokens)

    # ------------------------------------------------------------------ stats
    def pool_stats(self):
        return self.scheduler.stats()

    def num_compilations_since(self, start: int) -> int:
        from pagedjax.runner import CompileCounter

        return CompileCounter.count - start
