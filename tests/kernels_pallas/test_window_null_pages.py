"""The kernels' contract for hybrid KV groups: with a sliding window, page-table
entries of pages wholly before a sequence's first query's window may be the
null page (0, NaN-filled here) and the output stays what the full table gives."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.kernels_pallas import reference
from tests.kernels_pallas.test_kernels import KERNELS, run
from tests.kernels_pallas.test_reference import make_case

WINDOW = 6
PAGE = 4


def _null_out_of_window(args):
    """The args with every page before each sequence's window replaced by page 0."""
    q, pages, kv_lens, table, cu, num_seqs = args[:6]
    table = np.array(table)
    kv, cu_np = np.asarray(kv_lens), np.asarray(cu)
    dropped = 0
    for s in range(int(np.asarray(num_seqs).reshape(-1)[0])):
        first = int(kv[s]) - int(cu_np[s + 1] - cu_np[s])  # first query position
        cut = max(0, first - WINDOW + 1) // PAGE
        dropped += int((table[s, :cut] != 0).sum())
        table[s, :cut] = 0
    assert dropped, "the case must drop some pages"
    return (q, pages, kv_lens, jnp.asarray(table), cu, num_seqs) + tuple(args[6:]), dropped


@pytest.mark.parametrize("kind", ("xla",) + KERNELS)
def test_out_of_window_pages_may_be_null(kind):
    # decode rows far past the window, a prompt chunk starting late, a short one
    args, kw = make_case(41, [1, 1, 5, 2], [30, 17, 26, 3], num_kv_heads=1, group=2,
                         page_size=PAGE, pages_per_seq=8)
    attn = dict(sm_scale=0.5, sliding_window=WINDOW)
    want = np.asarray(reference.ragged_paged_attention(*args, **attn, **kw))
    nulled, _ = _null_out_of_window(args)
    if kind == "xla":
        got = reference.ragged_paged_attention(*nulled, **attn, **kw)
    else:
        got = run(kind, nulled, kw, **attn)
    got = np.asarray(got, np.float32)
    assert not np.isnan(got).any(), "a kernel read a null page outside the window"
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
