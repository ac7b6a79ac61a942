"""LLMEngine: add_request / step / abort, built from three parts.

* :class:`~pagedjax.engine.core.EngineCore` schedules, runs the device step and
  updates the scheduler; it returns plain per-sequence token deltas and
  overlaps the next step with the device (``async_scheduling``);
* :class:`~pagedjax.engine.output_processor.OutputProcessor` turns them into text,
  stop strings, logprob dicts and ``RequestOutput``;
* this class validates requests, wires the two together and hands stop-string
  finishes back to the core after each step.

Not thread-safe: the server drives it from one engine thread (``AsyncLLM``).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Sequence

import jax
import numpy as np

from pagedjax.distributed import multihost
from pagedjax.config import EngineArgs
from pagedjax.engine.core import EngineCore
from pagedjax.engine.generation_defaults import generation_defaults
from pagedjax.engine.output_processor import OutputProcessor
from pagedjax.engine.sequences import SEED_MODULUS
from pagedjax.outputs import RequestOutput
from pagedjax.core.request import Request
from pagedjax.worker.plan import make_plan
from pagedjax.worker.runner import Runner
from pagedjax.sampling_params import SamplingParams
from pagedjax.core.scheduler import Scheduler
from pagedjax.engine.startup import (
    compile_programs,
    enable_compilation_cache,
    phase_logger,
    freeze_startup_heap,
    resolve_config,
    slow_dtype_warning,
    start_cpu_builds,
    weight_quantization,
)
from pagedjax.engine import input_checks as checks
from pagedjax.structured_output.grammar import GrammarCompiler, GrammarState

logger = logging.getLogger("pagedjax.engine.llm_engine")


def _load_tokenizer(args: EngineArgs, resolved):
    """``args.tokenizer``, else the model's own, loading on a thread beside the weights:
    returns a future whose ``.result()`` is the tokenizer."""
    from pagedjax.engine import tokenizer as tok_mod

    if args.tokenizer:
        return tok_mod.load_tokenizer_in_background(args.tokenizer)
    return tok_mod.load_tokenizer_in_background(resolved.tokenizer_source,
                                                **dict(resolved.tokenizer_kwargs))


class LLMEngine:
    """The engine behind ``LLM`` and the server."""

    def __init__(self, args: EngineArgs):
        started = time.perf_counter()
        args.validate()
        self.args = args
        enable_compilation_cache(args.compilation_cache_dir)
        start_cpu_builds(args)
        self._resolve_model(args)
        tokenizer = _load_tokenizer(args, self.resolved)
        self._load_weights(args)
        self.tokenizer = tokenizer.result()
        self.config = resolve_config(args, self.info, self.mesh)
        kv = self._allocate_kv_pool(args)
        self.scheduler = self._make_scheduler(args)
        self.runner = Runner(self.model, self.params, kv, page_size=args.page_size,
                             max_num_seqs=args.max_num_seqs,
                             max_num_batched_tokens=self.config.max_num_batched_tokens,
                             max_model_len=self.config.max_model_len,
                             plan=make_plan(self.config.attention_backend, self.mesh,
                                            args.enable_expert_parallel, self._layer_map()),
                             lora_slot=self.lora.slot_of if self.lora is not None else None,
                             release_params=True)
        self.params = self.runner.params  # (packed weights: the loaded arrays are freed)
        self._make_core(args)
        self.processor = OutputProcessor(self.tokenizer)
        self.grammars = GrammarCompiler(self.tokenizer, self.info.vocab_size, self.eos_token_ids)
        self._rng = np.random.default_rng(args.seed)
        self._counter = itertools.count()
        self.num_prompt_tokens = 0
        phase_logger().info(
            "load: %.1f s (%s, %d layers, weights %.1f MiB on device, quantization=%s, "
            "KV pool %d pages)", time.perf_counter() - started, self.info.architecture,
            self.info.num_layers, self.weight_bytes / 2**20, self.quantization,
            self.config.num_pages)
        slow = slow_dtype_warning(self.model.dtype, jax.default_backend())
        if slow:
            logger.warning(slow)
        self.kv_capacity = self.scheduler.kv_capacity()
        logger.info("%s; KV cache size: %d tokens; maximum concurrency for %d tokens per "
                    "request: %.2fx", self.config.kv_layout.describe(), self.kv_capacity["tokens"],
                    self.config.max_model_len, self.kv_capacity["max_concurrency"])
        compile_programs(self.runner, args, started)
        freeze_startup_heap()

    # ------------------------------------------------------------------ building
    def _resolve_model(self, args: EngineArgs) -> None:
        """Where the model lives, its generation defaults and weight quantization."""
        import pagedjax.models as models

        self.resolved = models.resolve_model(args.model, revision=args.revision,
                                              download_dir=args.download_dir)
        self.default_sampling = generation_defaults(self.resolved.generation_config,
                                                    args.generation_config)
        self.model_name = args.model or models.DEFAULT_MODEL
        if jax.process_count() > 1 and args.tensor_parallel_size != jax.device_count():
            raise ValueError(
                f"{jax.process_count()} processes: multi-host runs shard one model over every "
                f"device of every process; set tensor_parallel_size={jax.device_count()} "
                "(jax.device_count())")
        self.quantization = weight_quantization(args, self.resolved)

    def _load_weights(self, args: EngineArgs) -> None:
        """The model and its weights on the device(s) (sharded under tensor
        parallelism), with LoRA slots when enabled."""
        import pagedjax.models as models

        if args.tensor_parallel_size > 1:
            from pagedjax.distributed import sharding

            self.model, self.params, self.mesh = sharding.load_sharded(
                args.model, args.dtype, args.tensor_parallel_size,
                quantization=self.quantization, resolved=self.resolved,
                expert_parallel=args.enable_expert_parallel)
        else:
            self.model, self.params = models.load_model(resolved=self.resolved, dtype=args.dtype,
                                                        quantization=self.quantization)
            self.mesh = None
        self.lora = None  # pagedjax.lora.manager.LoRAManager when enable_lora
        if args.enable_lora:
            from pagedjax.lora.setup import enable_lora, make_manager

            self.model, self.params = enable_lora(self.model, self.params, args, self.mesh)
            self.lora = make_manager(self.model, args, lambda: self.runner)
        self.info = self.model.info
        # Bytes of the weights as they sit on the device(s) (quantized stays quantized).
        self.weight_bytes = models.model_weight_bytes(self.params)

    def _allocate_kv_pool(self, args: EngineArgs):
        """The KV page pool (sharded, or layer-stacked when ``scan_layers`` applies)."""
        cfg = self.config
        pool_dtype = None if args.kv_cache_dtype == "auto" else cfg.kv_cache_dtype
        layout = cfg.kv_layout
        arrays = layout.num_slots if layout.multi else None  # hybrid KV groups share arrays
        if self.mesh is not None:
            from pagedjax.distributed import sharding

            kv = sharding.allocate_sharded_kv(self.model, self.mesh, cfg.num_pages,
                                              args.page_size, pool_dtype, num_arrays=arrays)
        else:
            kv = self.model.allocate_kv_caches(cfg.num_pages, args.page_size, pool_dtype,
                                               num_arrays=arrays)
        if (args.scan_layers and self.mesh is None and hasattr(self.model, "can_scan")
                and self.model.can_scan() and not layout.multi):
            self.params = self.model.stack_params(self.params)
            kv = self.model.stack_kv_caches(kv)
        return kv

    def _layer_map(self):
        """Each layer's (KV group, pool array) under hybrid KV groups, else None."""
        layout = self.config.kv_layout
        return layout.layer_map() if layout.multi else None

    def _make_scheduler(self, args: EngineArgs) -> Scheduler:
        cfg = self.config
        mnbt = cfg.max_num_batched_tokens
        multimodal = getattr(self.model, "is_multimodal", False)
        return Scheduler(cfg.num_pages, args.page_size, args.max_num_seqs, mnbt,
                         cfg.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
                         policy=args.scheduling_policy,
                         admit=self.lora.admit if self.lora is not None else None,
                         encoder_budget=mnbt if multimodal else None, kv_layout=cfg.kv_layout)

    def _make_core(self, args: EngineArgs) -> None:
        """The EngineCore, with the speculator, the image encoder's cache and the
        multi-host leader it needs."""
        # Multi-host: process 0 publishes its requests to the followers before each step.
        self._leader = multihost.make_leader()
        self.eos_token_ids = tuple(self.info.eos_token_ids) or (
            (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ())
        self.speculator = None
        if args.speculative_config is not None:
            from pagedjax.spec_decode.speculator import make_speculator

            self.speculator = make_speculator(args, self.config, self.runner, self.scheduler,
                                              self.info)
        self.mm_processor, encoder_cache = self._multimodal(args)
        self.core = EngineCore(self.scheduler, self.runner, self.eos_token_ids,
                               async_scheduling=args.async_scheduling,
                               speculator=self.speculator, encoder_cache=encoder_cache)
        if self.lora is not None:
            self.lora.warmup()

    def _multimodal(self, args: EngineArgs):
        """(MultiModalProcessor, EncoderCache) of a vision-language model, else (None, None)."""
        if not getattr(self.model, "is_multimodal", False):
            return None, None
        from pagedjax.engine.mm_processor import MultiModalProcessor
        from pagedjax.worker.encoder_cache import EncoderCache

        if self.speculator is not None:
            raise ValueError("speculative_config: speculative decoding is not supported with "
                             f"the vision-language model {self.info.architecture}")
        proc = MultiModalProcessor.for_model(self.resolved.path, self.model.abstract,
                                             args.limit_mm_per_prompt, args.max_image_pixels)
        examples = getattr(self.model.abstract, "encoder_warmup_data", None)
        if examples is not None:  # warm-up compiles the encoder at each patch bucket
            self.runner.encoder_examples = examples(proc.max_image_patches())
        return proc, EncoderCache(self.runner.encode_item, args.encoder_cache_size)

    @property
    def encoder_cache(self):
        """The vision encoder's output cache (worker/encoder_cache.py), None for text models."""
        return self.core.encoder_cache

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def num_pages(self) -> int:
        return self.config.num_pages

    @property
    def attn_backend(self) -> str:
        return self.config.attention_backend

    # ------------------------------------------------------------------ requests
    def tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """str, list of token ids, or {"prompt": ...} / {"prompt_token_ids": [...]}
        (ArgumentTypeError / ValueError naming the argument; ids checked against the
        vocabulary)."""
        checks.check_prompt(prompt)
        vocab = self.info.vocab_size
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                text = prompt.get("prompt")
                if text is not None and not isinstance(text, str):
                    raise checks.ArgumentTypeError("prompt['prompt'] must be a string or None, "
                                                   f"got {type(text).__name__}.")
                return text, checks.token_ids("prompt_token_ids", prompt["prompt_token_ids"],
                                              vocab)
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
            return prompt, list(ids)
        return None, checks.token_ids("prompt", prompt, vocab)

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0, *,
                    beam: bool = False, lora_request=None) -> None:
        """Validate and queue one request. Raises ValueError before any work starts.

        ``beam=True``: a sequence driven by beam search (no text side; its top-k
        logprobs are kept for :meth:`take_top_logprobs`, and steps run serially).
        ``lora_request``: a :class:`pagedjax.LoRARequest` (needs ``enable_lora``).
        """
        from pagedjax.engine import tokenizer as tok_mod

        params = checks.sampling_params(params)
        checks.request_id(request_id)
        priority = checks.priority(priority)
        params.verify_vocab(self.info.vocab_size)
        if self.processor.has(request_id) or not self.core.is_finished(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self.tokenize(prompt)
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        ids, mm_items = self._images(prompt, ids)
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens but max_model_len is "
                             f"{self.max_model_len}, which must also leave room for at least "
                             "one output token; shorten the prompt or raise max_model_len")
        grammar = self._grammar_state(params, beam)
        arrival = time.time() if arrival_time is None else arrival_time
        bad_ids = tok_mod.bad_words_token_ids(self.tokenizer, params.bad_words) \
            if params.bad_words else []
        # Prompt logprobs need every prompt position computed: a unique salt keeps
        # the prefix cache from skipping any of them.
        salt = f"plp-{request_id}-{next(self._counter)}" if (
            params.prompt_logprobs is not None or params.prompt_hidden_states == "all") else None
        if params.prompt_hidden_states is not None and self.speculator is not None:
            raise ValueError("prompt_hidden_states (pooling) cannot be combined with "
                             "speculative decoding; start the engine without it")
        user_salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        if user_salt is not None:  # vLLM's cache_salt: only prompts with the same salt share
            if not isinstance(user_salt, str):
                raise ValueError(f"cache_salt must be a string, got {type(user_salt).__name__}")
            salt = f"salt-{user_salt}|{salt or ''}"
        lora_id = self._check_lora(lora_request)
        if lora_id:  # prefix-cache pages of one adapter never serve another
            salt = f"lora-{lora_id}:{lora_request.lora_path}|{salt or ''}"
        if mm_items:  # prefix-cache pages of a prompt with images are keyed by the images too
            salt = f"mm-{','.join(it.content_hash for it in mm_items)}|{salt or ''}"
        req = Request(request_id, ids, params, eos_token_ids=self.eos_token_ids,
                      arrival_time=arrival, priority=priority, max_model_len=self.max_model_len,
                      cache_salt=salt, lora_int_id=lora_id)
        req.mm_items = mm_items
        if mm_items and getattr(self.model, "uses_mrope", False):  # computed once: the step reads the table
            req.mrope = self.model.abstract.mrope_positions(len(ids), mm_items)
        self.core.add_request(req, int(self._rng.integers(0, SEED_MODULUS)), bad_ids,
                              keep_topk=beam, grammar=grammar)  # ValueError: bad request
        if not beam:
            self.processor.add_request(request_id, text, ids, params, arrival)
        if self._leader is not None:
            self._leader.publish_add(request_id, prompt, params, arrival, priority)
        self.num_prompt_tokens += len(ids)

    def _images(self, prompt: Any, ids: list[int]) -> tuple[list[int], tuple]:
        """The prompt's ``multi_modal_data``: (ids with image placeholders expanded, MMItems)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if not data:
            return ids, ()
        if self.mm_processor is None:
            raise ValueError(f"multi_modal_data: the model {self.model_name} "
                             f"({self.info.architecture}) is text-only and takes no images")
        return self.mm_processor.process(ids, data)

    def _check_lora(self, lora_request) -> int:
        """Register a request's adapter (reads and checks it); its id, 0 for none."""
        if lora_request is None:
            return 0
        if self.lora is None:
            raise ValueError("lora_request needs an engine started with enable_lora=True")
        self.lora.add(lora_request)
        return lora_request.lora_int_id

    def add_lora(self, lora_request) -> None:
        """Register an adapter now (read and checked; loaded onto the device when used)."""
        self._check_lora(lora_request)

    def validate_lora(self, lora_request) -> None:
        """Read and check an adapter without registering it (safe off the engine thread)."""
        if self.lora is None:
            raise ValueError("LoRA adapters need an engine started with enable_lora=True")
        self.lora.validate(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter (queued requests still finish with it); False if unknown."""
        return self.lora is not None and self.lora.remove(lora_int_id)

    def compile_grammar(self, params: SamplingParams) -> None:
        """Check and compile ``params.structured_outputs`` into the engine's grammar cache
        (thread safe; AsyncLLM calls it in its worker pool so that ``add_request`` on
        the engine thread finds it compiled). Raises ValueError for an invalid spec."""
        if params.structured_outputs is not None:
            self.grammars.compile(params.structured_outputs)

    def _grammar_state(self, params: SamplingParams, beam: bool) -> GrammarState | None:
        if params.structured_outputs is None:
            return None
        if beam:
            raise ValueError("structured_outputs cannot be combined with beam search")
        spec = params.structured_outputs
        return GrammarState(self.grammars, self.grammars.compile(spec), spec.start_after,
                            params.allowed_token_ids)

    def abort_request(self, request_id: str | Sequence[str]) -> None:
        """Abort requests (all their sequences) at any time; their pages are freed at once."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self._leader is not None:
            self._leader.publish_abort(ids)
        for rid in ids:
            self.processor.abort(rid)
            self.core.abort_request(rid)

    def has_unfinished_requests(self) -> bool:
        """Requests still to finish (a step in flight whose requests all ended does
        not count: the next step completes it and ignores its rows)."""
        return len(self.processor) > 0 or self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.processor)

    def request_ids(self) -> list[str]:
        """Ids of every unfinished request (waiting or running)."""
        return self.processor.request_ids()

    def step_request_ids(self) -> list[str]:
        """Requests the latest ``step()`` worked on (its rows, and the step in flight):
        the ones to fail when that step raised."""
        return [rid for rid in self.core.step_request_ids() if self.processor.has(rid)]

    def scheduled_request_ids(self) -> list[str]:
        """Ids of unfinished requests that have been scheduled at least once."""
        return self.processor.scheduled_request_ids()

    # ------------------------------------------------------------------ beam search
    def fork_sequence(self, seq_id: str, new_seq_id: str) -> None:
        """A new sequence sharing ``seq_id``'s tokens and KV pages (copy-on-write)."""
        self.core.fork_sequence(seq_id, new_seq_id)

    def replace_pending_token(self, seq_id: str, token_id: int) -> None:
        """Swap a sequence's newest token (sampled, its KV not written yet)."""
        self.core.replace_pending_token(seq_id, token_id)

    def take_top_logprobs(self, seq_id: str) -> dict[int, float] | None:
        """A beam sequence's top-k logprobs from the latest step (once), else None."""
        return self.core.take_top_logprobs(seq_id)

    def finish_sequence(self, seq_id: str) -> None:
        """End one sequence of a request (a beam not kept); its pages are freed."""
        self.core.finish_sequences([seq_id])

    def is_sequence_finished(self, seq_id: str) -> bool:
        return self.core.is_finished(seq_id)

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        """Run one step; return outputs of requests that changed.

        Outputs follow each request's ``output_kind``: cumulative (the default: each
        CompletionOutput holds the whole text and token ids so far; a stop-string
        prefix still being matched is held back), deltas (only what is new since the
        request's previous output), or final only.
        With ``async_scheduling`` the outputs are those of the step before the one
        just launched.
        """
        if self._leader is not None:
            self._leader.before_step()
        outputs, stops = self.processor.process(self.core.step())
        for seq_id, matched in stops:  # stop strings: finished by the core after the update
            self.core.finish_sequences([seq_id], "stop", matched)
        return outputs

    @property
    def num_steps(self) -> int:
        return self.core.num_steps

    @property
    def num_generated_tokens(self) -> int:
        return self.processor.num_generated_tokens

    @property
    def finished_metrics(self):
        """Metrics of recently finished requests (bounded)."""
        return self.processor.finished_metrics

    def logits_of(self, hidden):
        """f32[n, H] final hidden states (pooling outputs' ``prompt_hidden_states``) ->
        f32[n, vocab] logits by the model's own head (cross-encoder scoring)."""
        return self.runner.logits_of(hidden)

    # ------------------------------------------------------------------ stats
    def pool_stats(self):
        return self.scheduler.stats()

    def spec_decode_stats(self) -> dict[str, int] | None:
        """Speculative decoding totals since start (None when it is off): verified
        rows with proposals, proposed tokens, accepted tokens (vLLM's
        spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens)."""
        s = self.speculator
        if s is None:
            return None
        return {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
                "num_accepted_tokens": s.num_accepted_tokens}

    def num_compilations_since(self, start: int) -> int:
        from pagedjax.worker.plan import CompileCounter

        return CompileCounter.count - start

