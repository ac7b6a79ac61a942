"""JAX starts quietly under pagedjax on a machine without a TPU, with libtpu installed.

libtpu (the test extra) prints "could not determine TPU accelerator type" and an
``E0000 ... unexpected worker hostname`` trace whenever JAX starts its backends on
a host without a TPU. The subprocess tests start JAX in a fresh interpreter and
read its stderr: plain ``import jax`` shows the lines here (so the check can
fail), ``import pagedjax`` first does not, a compile-only TPU target still
compiles, and a user's own TPU or platform setting is kept as it was.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from pagedjax import libtpu_env

NOISE = ("could not determine TPU", "Failed to find host bounds", "unexpected worker hostname",
         "Source Location Trace", "Logging before InitGoogle")

needs_libtpu_without_tpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None or libtpu_env.tpu_present(),
    reason="needs libtpu installed (the test extra) on a host without a TPU: "
           "elsewhere libtpu prints none of these lines")


def start(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` (with arguments ``args``) in a fresh interpreter, with none of the TPU or platform settings
    this process holds (``import pagedjax`` here set some) unless ``env`` gives them.
    Every process may load libtpu (the host-wide lock would otherwise stop libtpu
    before it prints anything when another process holds it)."""
    clean = {k: v for k, v in os.environ.items()
             if k not in libtpu_env.TOPOLOGY_VARS + ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT")}
    clean.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", **env)
    return subprocess.run([sys.executable, "-c", code, *args], env=clean, capture_output=True,
                          text=True, timeout=600)


def noise_in(stderr: str) -> list[str]:
    return [line for line in NOISE if line in stderr]


@needs_libtpu_without_tpu
def test_plain_jax_start_prints_libtpu_lines_here():
    proc = start("import jax; print(jax.devices())")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert noise_in(proc.stderr) == list(NOISE), proc.stderr[-2000:]


@needs_libtpu_without_tpu
def test_jax_start_after_import_pagedjax_is_quiet():
    proc = start("import os, pagedjax, jax; print(jax.devices()); "
                 "print(os.environ['TPU_HOST_BOUNDS'], os.environ['TPU_WORKER_HOSTNAMES'])")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert noise_in(proc.stderr) == [], proc.stderr[-2000:]
    assert "CpuDevice" in proc.stdout and "1,1,1 localhost" in proc.stdout


@needs_libtpu_without_tpu
def test_jax_imported_first_is_quiet_too():
    # JAX's backends start on first use, not at import: pagedjax is still in time.
    proc = start("import jax, pagedjax; print(jax.devices())")
    assert proc.returncode == 0 and noise_in(proc.stderr) == [], proc.stderr[-2000:]


@needs_libtpu_without_tpu
def test_compile_only_tpu_targets_unchanged_and_quiet():
    proc = start("import pagedjax\n"
                 "from pagedjax.kernels_pallas.pallas.tpu_compile import tpu_devices\n"
                 "for t in ('v5e:1x1', 'v6e:2x2', 'v5e:4x4'):\n"
                 "    d = tpu_devices(t)\n"
                 "    print(t, len(d), d[0].device_kind, len({x.process_index for x in d}))\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert noise_in(proc.stderr) == [], proc.stderr[-2000:]
    # One host for a 2x2 slice or smaller, four hosts of four chips for v5e-16.
    assert proc.stdout.split("\n")[:3] == ["v5e:1x1 1 TPU v5 lite 1", "v6e:2x2 4 TPU v6 lite 1",
                                           "v5e:4x4 16 TPU v5 lite 4"], proc.stdout


@needs_libtpu_without_tpu
def test_user_settings_are_kept():
    show = ("import os, pagedjax, jax; jax.devices(); "
            "print([os.environ.get(k) for k in "
            "('TPU_WORKER_HOSTNAMES', 'TPU_HOST_BOUNDS', 'JAX_PLATFORMS')], jax.default_backend())")
    mine = start(show, TPU_WORKER_HOSTNAMES="10.1.2.3")
    assert mine.returncode == 0, mine.stderr[-2000:]
    assert "['10.1.2.3', None, None] cpu" in mine.stdout
    cpu = start(show, JAX_PLATFORMS="cpu")
    assert "['localhost', '1,1,1', 'cpu'] cpu" in cpu.stdout, cpu.stderr[-2000:]
    # Asked for a TPU: libtpu as it is (the settings are read before JAX starts, which
    # fails here without a TPU, so they are printed first).
    tpu = start("import os, pagedjax; print([os.environ.get(k) for k in "
                "('TPU_WORKER_HOSTNAMES', 'TPU_HOST_BOUNDS')], flush=True)",
                JAX_PLATFORMS="tpu,cpu")
    assert tpu.returncode == 0 and "[None, None]" in tpu.stdout, (tpu.stdout, tpu.stderr[-2000:])


def fake_host(root, *, dev=(), pci=()) -> str:
    """A file tree with /dev nodes ``dev`` and PCI devices ``pci`` of (vendor, device)."""
    for node in dev:
        path = os.path.join(root, "dev", node)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
    for i, (vendor, device) in enumerate(pci):
        folder = os.path.join(root, "sys", "bus", "pci", "devices", f"0000:00:0{i}.0")
        os.makedirs(folder)
        for name, value in (("vendor", vendor), ("device", device)):
            with open(os.path.join(folder, name), "w") as f:
                f.write(value + "\n")
    return str(root)


@pytest.mark.parametrize("dev,pci,present", [
    ((), (), False),
    ((), [("0x1ae0", "0x0042"), ("0x10de", "0x2330")], False),  # Google's gVNIC, an H100
    (("accel0",), (), True),  # TPU v4 and older
    (("vfio/vfio",), (), False),  # the vfio control node alone
    (("vfio/vfio", "vfio/0"), (), True),  # TPU v5e and newer
    ((), [("0x1ae0", "0x006f")], True),  # a v6e on the PCI bus
])
def test_tpu_present(tmp_path, dev, pci, present):
    assert libtpu_env.tpu_present(fake_host(tmp_path, dev=dev, pci=pci)) is present


LIBTPU = {"TPU_LIBRARY_PATH": "/opt/libtpu.so"}


@pytest.mark.parametrize("env,tpu,expect_set", [
    ({}, False, True),
    ({"JAX_PLATFORMS": "cpu"}, False, True),
    ({}, True, False),  # a TPU host: libtpu must find its slice itself
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, False, False),
    ({"TPU_WORKER_ID": "0"}, False, False),
    ({"JAX_PLATFORMS": "TPU,cpu"}, False, False),
    ({"JAX_FORCE_TPU_INIT": "1"}, False, False),
])
def test_defaults_only_where_nothing_is_chosen(tmp_path, env, tpu, expect_set):
    environ = dict(LIBTPU, **env)
    root = fake_host(tmp_path, dev=("accel0",) if tpu else ())
    got = libtpu_env.quiet_libtpu_without_tpu(environ, root=root)
    assert got == (libtpu_env.NO_TPU_DEFAULTS if expect_set else {})
    assert environ == dict(LIBTPU, **env, **got)


def test_nothing_set_without_libtpu(tmp_path, monkeypatch):
    monkeypatch.setattr(libtpu_env.importlib.util, "find_spec", lambda name: None)
    environ: dict[str, str] = {}
    assert libtpu_env.quiet_libtpu_without_tpu(environ, root=str(tmp_path)) == {}
    assert environ == {}


@pytest.mark.slow
@needs_libtpu_without_tpu
def test_cli_generate_is_quiet(smollm2_gguf):
    """A newcomer's first command (README): the default model, no TPU lines."""
    proc = start("import sys; from pagedjax.entrypoints.cli import main; sys.exit(main(sys.argv[1:]))",
                 "generate", "The capital of France is", "--max-tokens", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert noise_in(proc.stderr) == [], proc.stderr[-2000:]
    assert proc.stdout.strip()
