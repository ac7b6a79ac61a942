"""Custom attention kernels under tensor parallelism: one kernel call per device.

A ``pallas_call`` (or an FFI custom call) is opaque to GSPMD, which would
gather every head onto every device. :func:`sharded_attention` wraps
:func:`kernels_pallas.ragged_paged_attention` in ``shard_map`` over heads:
q [T, Hq, D] is split on heads (query heads are ordered by KV head, so device
i gets the query heads of its own KV heads), the KV pool on its KV-head axis
(2 of [pages, 2, Hkv, page_size, D]) and the int8/fp8 scales likewise;
lengths, page tables and offsets are replicated. Same signature and result as
the unsharded call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def sharded_attention(mesh, axis: str = "tp"):
    """``ragged_paged_attention`` run per device of ``mesh`` on its own heads."""
    from pagedjax.kernels_pallas import ragged_paged_attention

    q_spec = P(None, axis, None)
    kv_spec = P(None, None, axis, None, None)
    s_spec = P(None, None, axis, None)
    rep = P()

    def attention(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, kv_scales=None,
                  **kw):
        num_seqs = jnp.asarray(num_seqs)
        if kv_scales is None:
            def body(q, kv, lens, table, cu, n):
                return ragged_paged_attention(q, kv, lens, table, cu, n, **kw)
            args = (q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs)
            specs = (q_spec, kv_spec, rep, rep, rep, rep)
        else:
            def body(q, kv, s, lens, table, cu, n):
                return ragged_paged_attention(q, kv, lens, table, cu, n, kv_scales=s, **kw)
            args = (q, kv_pages, kv_scales, kv_lens, page_table, cu_q_lens, num_seqs)
            specs = (q_spec, kv_spec, s_spec, rep, rep, rep, rep)
        f = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=q_spec, check_vma=False)
        return f(*args)

    return attention
