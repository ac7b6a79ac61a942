"""The per-machine row limit of the C++ few-row matmul (kernels_pallas/cpu/matmul_rows.py):
the choice from timings, its cache beside the kernel build, the environment override,
and the execution plan that uses it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from pagedjax.kernels_pallas.cpu import matmul_rows as cmr
from pagedjax.kernels_pallas.cpu import build as cpu_build, native as cpu_native

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the C++ matmul runs on the CPU platform")


@pytest.mark.parametrize("timings, rows", [
    ({8: (1.0, 2.0), 16: (2.0, 3.0), 32: (3.0, 4.0)}, 32),    # C++ wins everywhere
    ({8: (1.0, 2.0), 16: (3.0, 2.0), 32: (3.0, 4.0)}, 8),     # the loss at 16 outweighs 32
    ({8: (2.0, 1.0), 16: (1.0, 2.0), 32: (1.0, 2.0)}, 0),     # loses at the smallest: never
    ({8: (0.97, 1.0)}, 0),                                    # saves under 5%: XLA keeps it
    ({1: (1.0, 1.02), 2: (1.0, 2.0), 16: (3.0, 2.0)}, 2),     # a tie below a win
    ({1: (1.07, 1.0), 2: (1.0, 1.6), 8: (1.0, 1.3)}, 8),      # a noisy one-row count: no veto
    ({1: (1.5, 1.0), 2: (1.0, 1.2)}, 0),                      # a large loss first: never
    ({32: (2.0, 1.5), 8: (1.0, 2.0), 16: (2.0, 1.5)}, 8),     # order of the mapping is irrelevant
    ({1: (1.0, 2.0), 2: (2.0, 1.5), 8: (2.0, 1.5)}, 1),       # one row only (a decode of one user)
    ({}, 0),
])
def test_choice_is_the_count_whose_routing_saves_most(timings, rows):
    assert cmr.choose_rows(timings) == rows


def test_cache_round_trip_and_bad_files(tmp_path):
    so = tmp_path / "cpu_kernels_0123.so"
    path = cmr.cache_path(so)
    assert path.parent == tmp_path and path.name == "cpu_kernels_0123.matmul_rows.json"
    assert cmr.read_cache(path) is None  # none yet
    cmr.write_cache(path, 16, {8: (1e-3, 2e-3), 16: (2e-3, 3e-3)})
    assert cmr.read_cache(path) == 16
    data = json.loads(path.read_text())
    assert data["timings_s"]["16"] == {"cpp": 2e-3, "xla": 3e-3}
    assert not list(tmp_path.glob("*.tmp"))
    for bad in ("not json", "[1]", json.dumps({"format": 1, "rows": -1}),
                json.dumps({"format": 1, "rows": "8"}), json.dumps({"format": 1, "rows": True}),
                json.dumps({"format": 999, "rows": 8}),
                json.dumps({"format": 1, "rows": 8}),  # measured from 8 rows up: measure again
                json.dumps({"format": 2, "rows": 4}),  # over 4 cached weights: again
                json.dumps({"format": 3, "rows": 0})):  # the rule a noisy row could veto
        path.write_text(bad)
        assert cmr.read_cache(path) is None, bad


def test_decide_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(cmr.ENV, raising=False)
    so = tmp_path / "cpu_kernels_abc.so"
    calls = []

    def fake_measure():
        calls.append(1)
        return {8: (1.0, 2.0), 16: (1.0, 2.0), 32: (5.0, 2.0)}

    assert cmr.decide(so, measure_fn=fake_measure) == 16
    assert cmr.decide(so, measure_fn=fake_measure) == 16
    assert len(calls) == 1 and cmr.read_cache(cmr.cache_path(so)) == 16
    assert cmr.decide(None, measure_fn=fake_measure) == 0  # no vectorized build: never


def test_a_choice_measured_on_a_busy_machine_is_measured_again_once_it_is_quiet(
        tmp_path, monkeypatch):
    """A first start while other jobs load every core caches timings that are not the
    machine's: they hold while it stays busy, and the first quiet start replaces them."""
    from pagedjax.kernels_pallas.cpu import row_limit

    monkeypatch.delenv(cmr.ENV, raising=False)
    so = tmp_path / "cpu_kernels_abc.so"
    busy_load = row_limit.BUSY_LOAD_PER_CPU * (os.cpu_count() or 1) + 1.0
    calls = []

    def fake_measure(winner_until):
        def measure():
            calls.append(winner_until)
            return {r: (1.0, 2.0) if r <= winner_until else (3.0, 2.0) for r in (8, 16, 32)}
        return measure

    monkeypatch.setattr(row_limit, "load_average", lambda: busy_load)
    assert cmr.decide(so, measure_fn=fake_measure(8)) == 8
    assert row_limit.measured_busy(cmr.cache_path(so))
    assert cmr.decide(so, measure_fn=fake_measure(32)) == 8  # still busy: the cache holds
    monkeypatch.setattr(row_limit, "load_average", lambda: 0.1)
    assert cmr.decide(so, measure_fn=fake_measure(32)) == 32  # quiet: measured again
    assert not row_limit.measured_busy(cmr.cache_path(so))
    assert cmr.decide(so, measure_fn=fake_measure(8)) == 32  # a quiet choice holds
    monkeypatch.setattr(row_limit, "load_average", lambda: busy_load)
    assert cmr.decide(so, measure_fn=fake_measure(8)) == 32  # even when busy again
    assert calls == [8, 32]
    data = json.loads(cmr.cache_path(so).read_text())
    assert data["load_average"] == 0.1 and data["measured_busy"] is False


def test_environment_overrides_and_bad_values_say_what_to_change(tmp_path, monkeypatch):
    so = tmp_path / "cpu_kernels_abc.so"

    def no_measure():
        raise AssertionError("the override must not measure")

    for v, rows in (("0", 0), ("24", 24), (" 8 ", 8)):
        monkeypatch.setenv(cmr.ENV, v)
        assert cmr.decide(so, measure_fn=no_measure) == rows
    assert not cmr.cache_path(so).exists()
    for v in ("-1", "many", "2.5"):
        monkeypatch.setenv(cmr.ENV, v)
        with pytest.raises(ValueError, match="PAGEDJAX_NATIVE_MATMUL_ROWS.*non-negative integer"):
            cmr.decide(so, measure_fn=no_measure)


def test_real_measurement_gives_a_candidate_and_is_cached(tmp_path, monkeypatch):
    if not cpu_native.fast_matmul():
        pytest.skip("no vectorized C++ matmul here: "
                    f"{cpu_native.matmul_unavailable_reason() or 'built without AVX2 + FMA'}")
    monkeypatch.delenv(cmr.ENV, raising=False)
    timings = cmr.measure(reps=2)
    assert sorted(timings) == list(cmr.CANDIDATE_ROWS)
    assert all(c > 0 and x > 0 for c, x in timings.values())
    so = tmp_path / "cpu_kernels_real.so"
    rows = cmr.decide(so, measure_fn=lambda: timings)
    assert rows == cmr.choose_rows(timings) and rows in (0, *cmr.CANDIDATE_ROWS)


def _plan_rows(env: dict) -> list[int]:
    """make_plan's matmul row limits in a fresh process: cpu_native twice, then xla."""
    code = ("from pagedjax.worker.plan import make_plan\n"
            "print(make_plan('cpu_native').native_matmul_rows, make_plan('cpu_native')"
            ".native_matmul_rows, make_plan('xla').native_matmul_rows)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return [int(v) for v in r.stdout.split()]


def test_make_plan_uses_the_override_and_the_cached_choice(tmp_path):
    if not cpu_native.fast_matmul():
        pytest.skip("no vectorized C++ matmul here: "
                    f"{cpu_native.matmul_unavailable_reason() or 'built without AVX2 + FMA'}")
    # A private cache holding this build (same key, so the child finds it, no rebuild)
    # and a choice written here: the child's plan must read that choice.
    # (build(): the default flags' library, cached; build_info may name a build with other
    # flags made by the build-path tests)
    so = cpu_build.build(source=cpu_native.MATMUL_SOURCE, name="cpu_matmul")
    (tmp_path / "native").mkdir()
    shutil.copy(so, tmp_path / "native" / so.name)
    cmr.write_cache(cmr.cache_path(tmp_path / "native" / so.name), 5, {8: (1.0, 2.0)})  # 5: no measurement gives it
    env = {k: v for k, v in os.environ.items() if k != cmr.ENV}
    env["PAGEDJAX_CACHE_DIR"] = str(tmp_path)
    assert _plan_rows(env) == [5, 5, 0]
    assert _plan_rows({**env, cmr.ENV: "12"}) == [12, 12, 0]
