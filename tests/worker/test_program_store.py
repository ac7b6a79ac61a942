"""The program store (pagedjax/worker/program_store.py): programs kept whole on
disk and read back without tracing; any change to what a program depends on
(context, static arguments, argument shapes, XLA flags) is another key; a
damaged entry is compiled again. The cross-process check on a real engine is
tests/engine/test_compile_cache.py."""

from __future__ import annotations

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pagedjax.worker import program_store


@pytest.fixture
def store(tmp_path):
    """A store folder, with JAX's own persistent cache off: a program JAX read back
    from it is not stored, and tests earlier in the session may have filled it."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_enable_compilation_cache", False)
    cc.reset_cache()
    program_store.set_root(str(tmp_path))
    before = dict(program_store.counts)
    yield tmp_path
    program_store.set_root(None)
    program_store.counts.update(before)
    jax.config.update("jax_enable_compilation_cache", True)
    cc.reset_cache()


def _traced_fn():
    traces = []

    def f(w, kv, x, *, scale):
        traces.append(1)
        y = jnp.tanh(x @ w) * scale
        return y, kv.at[0].add(y[0, 0])

    return f, traces


def _wrapper(context="ctx"):
    f, traces = _traced_fn()
    jit = jax.jit(f, static_argnames=("scale",), donate_argnums=(1,))
    return program_store.StoredJit(jit, "f", context, fixed=1), traces


def _args():
    return jnp.ones((8, 8)), jnp.zeros(16), np.full((2, 8), 0.5, np.float32)


def _delta(before):
    return {k: program_store.counts[k] - before[k] for k in before}


def test_a_new_wrapper_reads_the_program_back_without_tracing(store):
    before = dict(program_store.counts)
    first, traces1 = _wrapper()
    w, kv, x = _args()
    y1, kv1 = first(w, kv, x, scale=2.0)
    assert traces1 and _delta(before) == {"lowered": 1, "loaded": 0, "stored": 1}
    assert len(glob.glob(os.path.join(store, "programs", "*", "*.bin"))) == 1

    before = dict(program_store.counts)
    second, traces2 = _wrapper()  # as a new process would build it
    w, kv, x = _args()
    y2, kv2 = second(w, kv, x, scale=2.0)
    assert traces2 == [] and _delta(before) == {"lowered": 0, "loaded": 1, "stored": 0}
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))
    assert kv.is_deleted()  # the donation is part of the stored program
    y3, kv3 = second(w, kv2, x, scale=2.0)  # in memory now
    assert _delta(before)["loaded"] == 1
    np.testing.assert_allclose(float(kv3[0]), 2 * float(y1[0, 0]), rtol=1e-6)


@pytest.mark.parametrize("change", ["context", "static", "shape", "xla_flags"])
def test_a_changed_dependency_reads_no_entry(store, change, monkeypatch):
    wrapper, _ = _wrapper()
    w, kv, x = _args()
    wrapper(w, kv, x, scale=2.0)
    before = dict(program_store.counts)
    context, scale = "ctx", 2.0
    if change == "context":
        context = "another model"
    elif change == "static":
        scale = 3.0
    elif change == "shape":
        x = np.ones((4, 8), np.float32)
    else:
        monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=false")
    other, traces = _wrapper(context)
    y, _ = other(w, jnp.zeros(16), x, scale=scale)
    assert traces and _delta(before) == {"lowered": 1, "loaded": 0, "stored": 1}
    np.testing.assert_allclose(np.asarray(y), np.tanh(np.asarray(x) @ np.ones((8, 8))) * scale,
                               rtol=1e-5)


def _no_object_code(raw: bytes) -> bytes:
    # what a re-serialized, deserialized executable looks like (the pickle keeps the
    # payload's bytes as they are)
    assert b"\x7fELF" in raw
    return raw.replace(b"\x7fELF", b"\x00ELF")


@pytest.mark.parametrize("damage, logged", [(lambda raw: b"not a program", "could not be read back"),
                                            (_no_object_code, "no object code")])
def test_a_damaged_entry_is_compiled_again(store, caplog, damage, logged):
    wrapper, _ = _wrapper()
    w, kv, x = _args()
    wrapper(w, kv, x, scale=2.0)
    (path,) = glob.glob(os.path.join(store, "programs", "*", "*.bin"))
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(damage(raw))
    before = dict(program_store.counts)
    again, traces = _wrapper()
    y, _ = again(w, jnp.zeros(16), x, scale=2.0)
    assert traces and _delta(before)["lowered"] == 1 and _delta(before)["loaded"] == 0
    assert logged in caplog.text
    np.testing.assert_allclose(np.asarray(y), np.tanh(np.asarray(x) @ np.ones((8, 8))) * 2,
                               rtol=1e-5)


def test_compile_obtains_without_running_and_calls_reuse_it(store):
    wrapper, traces = _wrapper()
    w, kv, x = _args()
    wrapper.compile(w, jax.ShapeDtypeStruct((16,), jnp.float32),
                    jax.ShapeDtypeStruct((2, 8), jnp.float32), scale=2.0)
    before = dict(program_store.counts)
    wrapper(w, kv, x, scale=2.0)
    assert len(traces) == 1 and _delta(before) == {"lowered": 0, "loaded": 0, "stored": 0}


def test_without_a_folder_it_is_the_jitted_function(tmp_path):
    program_store.set_root(None)
    before = dict(program_store.counts)
    wrapper, traces = _wrapper()
    w, kv, x = _args()
    wrapper(w, kv, x, scale=2.0)
    assert traces and _delta(before) == {"lowered": 0, "loaded": 0, "stored": 0}
    assert not os.listdir(tmp_path)


def test_keys_cover_code_settings_and_model():
    key = program_store.program_key("step", "ctx", 1)
    assert key == program_store.program_key("step", "ctx", 1)
    assert key != program_store.program_key("step", "ctx", 2)
    assert len(program_store.code_fingerprint()) == 64

    class Model:
        module_cls = dict
        config = {"hidden_size": 64}
        dtype = "float32"
        quantized = {}
        lora = None

    a = program_store.model_fingerprint(Model())
    Model.config = {"hidden_size": 32}
    assert program_store.model_fingerprint(Model()) != a


def test_a_program_jax_read_back_is_not_stored(tmp_path):
    """An executable JAX deserialized from its own persistent cache does not
    serialize whole again (XLA:CPU drops its functions): only fresh
    compilations are stored, the other ones trace again next time."""
    from pagedjax.engine import compile_cache

    folder = compile_cache.enable(str(tmp_path))
    try:
        first, _ = _wrapper()
        w, kv, x = _args()
        first(w, kv, x, scale=5.0)  # fresh: stored, and written to JAX's cache
        for path in glob.glob(os.path.join(folder, "programs", "*", "*.bin")):
            os.remove(path)
        jax.clear_caches()  # the next compile reads JAX's disk cache
        before = dict(program_store.counts)
        second, traces = _wrapper()
        y, _ = second(w, jnp.zeros(16), x, scale=5.0)
        assert traces and _delta(before) == {"lowered": 1, "loaded": 0, "stored": 0}
        assert not glob.glob(os.path.join(folder, "programs", "*", "*.bin"))
        np.testing.assert_allclose(np.asarray(y), np.tanh(np.asarray(x) @ np.ones((8, 8))) * 5,
                                   rtol=1e-5)
    finally:
        program_store.set_root(None)


def test_a_program_jax_handed_back_from_memory_is_not_stored(tmp_path):
    """A direct call of the jitted function reads the program back from JAX's
    disk cache; the wrapper's compile then gets that deserialized executable from
    JAX's memory, with no cache-hit event. Serialized, it would lack its object
    code and fail in the next process ("Function ... not found"): the store
    checks the bytes and keeps nothing."""
    from pagedjax.engine import compile_cache

    folder = compile_cache.enable(str(tmp_path))
    try:
        f, _ = _traced_fn()
        jit = jax.jit(f, static_argnames=("scale",), donate_argnums=(1,))
        w, kv, x = _args()
        jit(w, kv, x, scale=7.0)  # compiled, written to JAX's cache only
        jax.clear_caches()
        jit(w, jnp.zeros(16), x, scale=7.0)  # read back from JAX's disk cache
        before = dict(program_store.counts)
        wrapper = program_store.StoredJit(jit, "f", "ctx", fixed=1)
        wrapper(w, jnp.zeros(16), x, scale=7.0)
        assert _delta(before) == {"lowered": 1, "loaded": 0, "stored": 0}
        assert not glob.glob(os.path.join(folder, "programs", "*", "*.bin"))
        # What storing it would have written: no object code, and it fails when run.
        from jax.experimental.serialize_executable import deserialize_and_load, serialize

        payload, in_tree, out_tree = serialize(jit.lower(w, jnp.zeros(16), x, scale=7.0).compile())
        assert not program_store.carries_code(payload)
        with pytest.raises(Exception, match="not found"):
            deserialize_and_load(payload, in_tree, out_tree)(w, jnp.zeros(16), x)
    finally:
        program_store.set_root(None)


def test_a_program_kept_out_of_the_store_is_neither_read_nor_written(store):
    """``stored=False`` (a program that does not span every local device: a stored one
    is read back onto all of them) goes through the jitted function, by a call and by
    the warm-up's ``compile`` alike."""
    f, _ = _traced_fn()
    jit = jax.jit(f, static_argnames=("scale",), donate_argnums=(1,))
    wrapper = program_store.StoredJit(jit, "f", "ctx", fixed=1, stored=False)
    w, kv, x = _args()
    before = dict(program_store.counts)
    wrapper.compile(w, jax.ShapeDtypeStruct((16,), jnp.float32),
                    jax.ShapeDtypeStruct((2, 8), jnp.float32), scale=2.0)
    wrapper(w, kv, x, scale=2.0)
    assert _delta(before) == {k: 0 for k in before}
    assert not glob.glob(os.path.join(store, "programs", "*", "*.bin"))
    assert program_store.spans_local_devices(jax.local_device_count())
    assert not program_store.spans_local_devices(jax.local_device_count() + 1)
