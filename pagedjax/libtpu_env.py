"""libtpu's topology settings on a machine without a TPU, so JAX starts quietly.

With libtpu installed (``jax[tpu]``, or the ``test`` extra for the device-less
TPU compile checks), JAX's TPU backend factory loads and initialises libtpu
whenever JAX starts its backends, on every machine. With no TPU there, libtpu
cannot read the slice's accelerator type and worker hostnames, and prints
"Failed to find host bounds ... could not determine TPU accelerator type" and
an ``E0000 ... INVALID_ARGUMENT: unexpected worker hostname`` trace before the
TPU backend fails quietly and JAX goes on with CPU or GPU. The same lines come
when ``jax.experimental.topologies`` loads libtpu for a compile-only TPU target.

:func:`quiet_libtpu_without_tpu` (run by ``import pagedjax``, before JAX starts
its backends) answers those two questions for libtpu with what is true of a
host with no TPU: one host (``TPU_HOST_BOUNDS=1,1,1``), itself
(``TPU_WORKER_HOSTNAMES=localhost``). It sets them only when all of these hold:

- libtpu is installed (nothing would read them otherwise);
- this host has no TPU: no ``/dev/accel*`` or ``/dev/vfio/<group>`` device
  (the nodes libtpu opens a chip through) and no PCI device with Google's
  vendor id and a TPU device id (the scan JAX's own ``cloud_tpu_init`` does);
- the user chose nothing: none of the TPU topology variables is set, neither
  ``JAX_FORCE_TPU_INIT`` nor a ``JAX_PLATFORMS`` (or ``jax_platforms``) that
  names ``tpu``.

Compile-only TPU devices do not read these settings: topologies such as
``v5e:4x4`` describe the same devices and hosts with them as without.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import MutableMapping

# What libtpu asks of a slice, as a host with no TPU answers it.
NO_TPU_DEFAULTS = {"TPU_HOST_BOUNDS": "1,1,1", "TPU_WORKER_HOSTNAMES": "localhost"}

# A TPU slice's topology as users, GKE and TPU VM images set it: any one set, nothing changes.
TOPOLOGY_VARS = (
    "TPU_ACCELERATOR_TYPE", "TPU_HOST_BOUNDS", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID",
    "TPU_PROCESS_ADDRESSES", "TPU_PROCESS_BOUNDS", "TPU_PROCESS_PORT",
    "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_TOPOLOGY",
    "TPU_TOPOLOGY_WRAP", "TPU_TOPOLOGY_ALT", "TPU_HOSTNAME_OVERRIDE",
)

_GOOGLE_PCI_VENDOR = "0x1ae0"
# TPU chips' PCI device ids, as jax._src.hardware_utils lists them (v3 ... TPU7x);
# a newer chip still shows up through its /dev node.
_TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})


def tpu_present(root: str = "/") -> bool:
    """True when this host may have a TPU: a TPU device node, or a TPU on the PCI bus."""
    if glob.glob(os.path.join(root, "dev", "accel*")):
        return True
    vfio = os.path.join(root, "dev", "vfio")
    if os.path.isdir(vfio) and any(name != "vfio" for name in os.listdir(vfio)):
        return True
    for vendor in glob.glob(os.path.join(root, "sys", "bus", "pci", "devices", "*", "vendor")):
        if (_read(vendor) == _GOOGLE_PCI_VENDOR
                and _read(os.path.join(os.path.dirname(vendor), "device")) in _TPU_PCI_DEVICES):
            return True
    return False


def libtpu_installed(environ: MutableMapping[str, str] | None = None) -> bool:
    """True when JAX would find libtpu (the ``libtpu`` package, or ``TPU_LIBRARY_PATH``)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("TPU_LIBRARY_PATH")) or importlib.util.find_spec("libtpu") is not None


def user_chose(environ: MutableMapping[str, str]) -> str | None:
    """The setting by which the user chose a TPU configuration or asked for a TPU, else None."""
    for name in TOPOLOGY_VARS + ("JAX_FORCE_TPU_INIT",):
        if name in environ:
            return name
    if "tpu" in _jax_platforms(environ).lower():
        return "JAX_PLATFORMS"
    return None


def quiet_libtpu_without_tpu(environ: MutableMapping[str, str] | None = None,
                             root: str = "/") -> dict[str, str]:
    """Set :data:`NO_TPU_DEFAULTS` in ``environ`` (``os.environ``) when libtpu is
    installed, this host has no TPU and the user chose no TPU setting; returns what
    it set (empty when it left everything as it was)."""
    environ = os.environ if environ is None else environ
    if user_chose(environ) or not libtpu_installed(environ) or tpu_present(root):
        return {}
    for name, value in NO_TPU_DEFAULTS.items():
        environ[name] = value
    return dict(NO_TPU_DEFAULTS)


def _jax_platforms(environ: MutableMapping[str, str]) -> str:
    """JAX_PLATFORMS, or jax_platforms where JAX is imported already and it was set in code."""
    value = environ.get("JAX_PLATFORMS", "")
    jax = sys.modules.get("jax")
    config = getattr(jax, "config", None)
    if config is not None:
        try:
            value = value or (config.jax_platforms or "")
        except AttributeError:  # jax only partly imported
            pass
    return value


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""
