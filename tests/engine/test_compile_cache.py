"""The persistent compilation cache (pagedjax/engine/compile_cache.py): a second
process on the same cache compiles nothing; a changed setting reads back no
entry of another one; another machine or software version gets another folder.

Each start is a fresh ``python`` process (tests/engine/cache_child.py): a tiny
random Llama, every program compiled by warm-up, then greedy and top-p
requests with logprobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pagedjax.engine import compile_cache
from tests.utils.paths import REPO_ROOT


def _start(tiny_llama_dir, smollm2_gguf, cache: str, max_num_seqs: int) -> dict:
    env = dict(os.environ, PAGEDJAX_NATIVE_MATMUL_ROWS="0")
    r = subprocess.run([sys.executable, "-m", "tests.engine.cache_child", tiny_llama_dir,
                        smollm2_gguf, cache, str(max_num_seqs)], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def starts(tiny_llama_dir, smollm2_gguf, tmp_path_factory):
    """first: an empty cache; second: the same settings on the same cache;
    changed: max_num_seqs 8 instead of 4 on that cache; fresh: max_num_seqs 8 on
    an empty cache of its own."""
    shared = str(tmp_path_factory.mktemp("xla_shared"))
    run = lambda cache, seqs: _start(tiny_llama_dir, smollm2_gguf, cache, seqs)  # noqa: E731
    return {"first": run(shared, 4), "second": run(shared, 4), "changed": run(shared, 8),
            "fresh": run(str(tmp_path_factory.mktemp("xla_fresh")), 8)}


def test_second_process_on_the_same_cache_compiles_nothing(starts):
    first, second = starts["first"], starts["second"]
    assert first["warmup"]["compiled"] > 0 and first["warmup"]["read_back"] == 0
    for phase in ("load", "warmup", "generate"):
        assert second[phase]["compiled"] == 0, (phase, second)
    # Every program warm-up obtained came back from the disk.
    assert second["warmup"]["read_back"] == first["warmup"]["compiled"]
    assert second["generate"]["read_back"] == 0  # all found in memory after warm-up
    assert second["tokens"] == first["tokens"] and second["logprobs"] == first["logprobs"]


def test_second_process_traces_no_step_program(starts):
    """The runner's programs come back whole from the program store: the second
    start traces and lowers none of them (the first traced and stored each)."""
    first, second = starts["first"], starts["second"]
    assert first["store"]["lowered"] > 0 and first["store"]["stored"] == first["store"]["lowered"]
    assert first["store"]["loaded"] == 0
    assert second["store"]["lowered"] == 0 and second["store"]["stored"] == 0
    assert second["store"]["loaded"] == first["store"]["stored"]


def test_changed_setting_reads_no_incompatible_entry(starts):
    changed, fresh = starts["changed"], starts["fresh"]
    # max_num_seqs 8 adds row buckets: their programs are not in the cache and
    # are compiled; programs whose shapes did not change are read back.
    assert changed["warmup"]["compiled"] > 0
    assert changed["warmup"]["read_back"] > 0
    assert changed["generate"]["compiled"] == 0
    # Exactly what the same setting computes from an empty cache: no entry of
    # the other setting was taken for one of its programs.
    assert (changed["warmup"]["compiled"] + changed["warmup"]["read_back"]
            == fresh["warmup"]["compiled"])
    assert changed["tokens"] == fresh["tokens"] and changed["logprobs"] == fresh["logprobs"]
    # The program store: the programs max_num_seqs changes (the steps' token
    # source, the sampler's rows) are traced again; only those whose key is the
    # same (the page copies: same pool, same index widths) are loaded.
    assert changed["store"]["lowered"] > 0
    assert changed["store"]["loaded"] < changed["store"]["lowered"]
    assert changed["store"]["lowered"] + changed["store"]["loaded"] == fresh["store"]["lowered"]


def test_namespace_separates_machines_and_versions():
    parts = compile_cache.namespace_parts()
    ns = compile_cache.namespace(parts)
    assert ns == compile_cache.namespace() and ns.startswith(parts["platform"] + "-")
    for key, value in (("cpu", "model name : another CPU\nflags : sse2"), ("jax", "0.0.1"),
                       ("jaxlib", "0.0.1"), ("devices", "8 x TPU v5e"), ("pagedjax", "9.9")):
        assert compile_cache.namespace({**parts, key: value}) != ns, key


def test_enable_points_jax_at_the_namespaced_folder(tmp_path):
    import jax

    path = compile_cache.enable(str(tmp_path))
    assert path == os.path.join(str(tmp_path), compile_cache.namespace())
    assert jax.config.jax_compilation_cache_dir == path
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
