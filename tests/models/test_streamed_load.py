"""Loading places each tensor on the device as soon as it is read (models.prepare
with a placer): the host never holds the whole model, and placing compiles no
XLA program."""

from __future__ import annotations

import numpy as np

import pagedjax.models as models
from pagedjax.models import weights
from pagedjax.worker.plan import CompileCounter


def test_each_tensor_is_placed_before_the_next_is_read(tiny_llama_dir):
    resolved = models.resolve_model(tiny_llama_dir)
    ckpt = models.open_checkpoint(resolved)
    events: list[tuple[str, str]] = []

    def get(name):
        events.append(("read", name))
        return ckpt.get(name)

    def place(key, arr):
        events.append(("place", key))
        return ("placed", key, arr.dtype)

    m = models.build_model(resolved, "float32")
    state = weights.placed_state(m, get, None, place)
    keys = [k for kind, k in events if kind == "place"]
    assert sorted(keys) == sorted(m.param_shapes())  # every parameter, once
    # Reads and placements alternate: at most one parameter's tensors are on the
    # host between two placements (a fused q/k/v reads three, then places one).
    held = 0
    for kind, _ in events:
        held = held + 1 if kind == "read" else 0
        assert held <= 3
    from flax import nnx

    shapes = m.param_shapes()
    flat = nnx.traversals.flatten_mapping(state, is_leaf=lambda _, x: isinstance(x, tuple))
    assert len(flat) == len(shapes)
    for path, leaf in flat.items():  # what place returned, each cast to its dtype first
        key = ".".join(map(str, path))
        assert leaf == ("placed", key, shapes[key].dtype)


def test_load_model_compiles_nothing_and_matches_the_host_state(tiny_llama_dir):
    import jax

    CompileCounter.install()
    c0 = CompileCounter.count
    m, params = models.load_model(tiny_llama_dir, dtype="bfloat16")
    assert CompileCounter.count - c0 == 0  # device_put only: no staging programs
    _, host = models.prepare(models.resolve_model(tiny_llama_dir), "bfloat16")
    flat_dev = jax.tree_util.tree_leaves_with_path(params)
    flat_host = dict(jax.tree_util.tree_leaves_with_path(host))
    assert len(flat_dev) == len(flat_host) > 0
    for path, arr in flat_dev:
        ref = flat_host[path]
        assert isinstance(arr, jax.Array) and arr.dtype == ref.dtype == m.dtype
        np.testing.assert_array_equal(np.asarray(arr), ref)
