"""The interface every model module implements, and the per-step attention metadata.

The engine (``pagedjax/worker/runner.py``) only talks to models through this file:

    model, params = models.load_model("SmolLM2-135M-Instruct", dtype="float32")
    kv_caches = model.allocate_kv_caches(num_pages, page_size, kv_cache_dtype)
    plan = ExecutionPlan(attn_backend="xla")
    hidden, kv_caches = model.forward(params, kv_caches, token_ids, meta, plan)
    logits = model.compute_logits(params, hidden[logits_index], plan)

``forward`` and ``compute_logits`` are pure functions of their arguments, safe
under ``jax.jit`` with ``kv_caches`` donated and ``plan`` static: everything
that changes the compiled program is in the plan, nothing is read from
context variables or attributes while tracing.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Where the step's tokens sit in the page pool (device arrays + static hints).

    T = padded token count, S = padded sequence count, P = padded pages per sequence.
    """

    positions: jax.Array  # i32[T]     position of each token in its sequence
    slot_mapping: jax.Array  # i32[T]  page_id * page_size + offset; padding -> 0 (null page)
    #                          (i32[G, T] and page_table i32[G, S, P]: hybrid KV groups,
    #                          ExecutionPlan.kv_layout)
    kv_lens: jax.Array  # i32[S]       context length incl. this step's tokens; padding -> 0
    page_table: jax.Array  # i32[S, P] physical page ids; padding -> 0
    cu_q_lens: jax.Array  # i32[S+1]   prefix sums of new-token counts (padding seqs add 0)
    num_seqs: jax.Array  # i32[]       valid sequences
    lora_slots: jax.Array | None = None  # i32[T] LoRA slot of each token (-1: none);
    #                                      None when LoRA serving is off (models/lora.py)
    mrope_positions: jax.Array | None = None  # i32[3, T] (t, h, w) rotary positions of
    #                                      M-RoPE models (models/qwen2_5_vl.py); None: others
    # Static (part of the compiled shape, not traced):
    max_q_len: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    def for_group(self, group: int) -> "AttentionMetadata":
        """The metadata of KV group ``group`` (its page table and slots)."""
        return dataclasses.replace(self, page_table=self.page_table[group],
                                   slot_mapping=self.slot_mapping[group])


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """Everything besides array shapes that changes the compiled step program.

    Frozen and hashable: the runner builds one at start-up and passes it to
    ``jax.jit`` as a static argument; a benchmark that needs a variant (say,
    attention switched off) builds its own with ``dataclasses.replace``.

    attn_backend        kernels_pallas backend of every layer: "xla",
                        "cpu_native", "pallas_gpu", "pallas_tpu"
    native_matmul_rows  float32 matmuls with at most this many rows run the
                        C++ CPU kernel (pagedjax.kernels_pallas.cpu.native.matmul); 0: never
    block_matmul_rows   matmuls with GGUF block-quantized weights (q8_0, q4_0, q4_1,
                        q4_k, q6_k) and at most this many float32 rows run the C++
                        block kernel (pagedjax.kernels_pallas.cpu.blockmatmul) on one
                        device; 0: never (they dequantize in jnp)
    int8_matmul_rows    the same for per-channel int8 weights and the C++ int8 kernel;
                        None: native_matmul_rows
    mesh, tp_axis       tensor parallelism: the custom kernels (everything but
                        "xla") run per device through shard_map over KV heads
    attention_fn        replaces kernels_pallas.ragged_paged_attention (same
                        signature); for benchmarks and tests
    expert_parallel     mixture-of-experts layers under a mesh: whole experts per
                        device (else each expert's intermediate size split)
    moe_impl            grouped matmul of the experts (kernels_pallas/grouped_matmul.py):
                        "auto", "ragged", "gather", "blocked"
    kv_layout           hybrid KV groups (core/kv_groups.py KVLayout.layer_map()): the
                        (group, array) of each layer; the step's page_table is then
                        i32[G, S, P] and slot_mapping i32[G, T], one per group, and
                        kv_caches holds one (pages, scales) pair per array. None: one
                        group, one array per layer
    """

    attn_backend: str = "xla"
    native_matmul_rows: int = 0
    block_matmul_rows: int = 0
    int8_matmul_rows: int | None = None
    mesh: Any = None  # jax.sharding.Mesh | None
    tp_axis: str = "tp"
    attention_fn: Callable | None = None
    expert_parallel: bool = False
    moe_impl: str = "auto"
    kv_layout: tuple | None = None


DEFAULT_PLAN = ExecutionPlan()


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about a loaded model."""

    architecture: str  # HF architectures[0]
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_model_len: int  # max_position_embeddings (or the model's context limit)
    dtype: Any  # jnp dtype of params/activations
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # Each layer's sliding window (None: full attention); () when every layer is full.
    # The engine splits the layers into KV groups by it (core/kv_groups.py).
    layer_windows: tuple = ()
