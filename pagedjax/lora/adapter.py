"""Read a PEFT LoRA adapter folder into host slot values (numpy, no torch).

A PEFT adapter is ``adapter_config.json`` (``r``, ``lora_alpha``,
``target_modules``, ...) plus ``adapter_model.safetensors`` whose tensors are
named ``base_model.model.<HF module>.lora_A.weight`` [r, in] and
``...lora_B.weight`` [out, r]. Each HF module must be one of the projections
the model exposes (``pagedjax.models.lora.find_targets``); the result maps every target
projection to its (A [In, R], B [R, *Out]) slot values, scaling folded into B.
Anything pagedjax cannot serve exactly raises ValueError naming what to change.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from pagedjax.models import lora as lora_mod

PREFIX = "base_model.model."
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def read_config(path: str) -> dict:
    """The adapter's config, checked for features pagedjax does not serve."""
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter {path!r}: not a folder (give a PEFT adapter folder "
                         f"with {CONFIG} and {WEIGHTS})")
    cfg_path = os.path.join(path, CONFIG)
    if not os.path.isfile(cfg_path):
        raise ValueError(f"LoRA adapter {path!r}: {CONFIG} is missing (not a PEFT adapter folder)")
    if not os.path.isfile(os.path.join(path, WEIGHTS)):
        hint = (" (only adapter_model.bin found: re-save it with safe_serialization=True)"
                if os.path.isfile(os.path.join(path, "adapter_model.bin")) else "")
        raise ValueError(f"LoRA adapter {path!r}: {WEIGHTS} is missing{hint}")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise ValueError(f"LoRA adapter {path!r}: {CONFIG} is not readable JSON "
                         f"({type(e).__name__})") from None
    check_config_values(path, cfg)
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    checks = [
        (peft_type != "LORA", f"peft_type is {peft_type!r}; only LORA adapters are served"),
        (bool(cfg.get("use_dora")), "use_dora=true (DoRA) is not supported"),
        (bool(cfg.get("fan_in_fan_out")), "fan_in_fan_out=true (Conv1D models) is not supported"),
        (cfg.get("bias", "none") != "none", f"bias={cfg.get('bias')!r}: only bias='none'"),
        (bool(cfg.get("lora_bias")), "lora_bias=true is not supported"),
        (bool(cfg.get("modules_to_save")), f"modules_to_save={cfg.get('modules_to_save')} "
                                           "(fully trained extra modules) is not supported"),
        (bool(cfg.get("alpha_pattern")), "alpha_pattern (per-module alpha) is not supported"),
    ]
    for bad, why in checks:
        if bad:
            raise ValueError(f"LoRA adapter {path!r}: {why}")
    return cfg


def check_config_values(path: str, cfg) -> None:
    """The config is a JSON object whose rank and alpha are usable numbers (ValueError)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"LoRA adapter {path!r}: {CONFIG} must be a JSON object, got "
                         f"a {type(cfg).__name__}")
    r = cfg.get("r", 8)
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise ValueError(f"LoRA adapter {path!r}: r (the rank) must be a positive integer, "
                         f"got {str(r)[:40]!r}")
    alpha = cfg.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"LoRA adapter {path!r}: lora_alpha must be a finite number, got "
                         f"{str(alpha)[:40]!r}")
    for key in ("peft_type", "bias"):
        if key in cfg and cfg[key] is not None and not isinstance(cfg[key], str):
            raise ValueError(f"LoRA adapter {path!r}: {key} must be a string")


def _scaling(cfg: dict, r: int) -> float:
    alpha = float(cfg.get("lora_alpha", 8))
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def read_pieces(path: str, cfg: dict, max_rank: int) -> dict[str, tuple]:
    """HF module name -> (lora_A [r, in], lora_B [out, r], scaling), checked."""
    from safetensors.numpy import load_file

    try:
        tensors = load_file(os.path.join(path, WEIGHTS))
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file
        raise ValueError(f"LoRA adapter {path!r}: cannot read {WEIGHTS}: {e}") from e
    mats: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in tensors.items():
        name = key[len(PREFIX):] if key.startswith(PREFIX) else key
        for kind in ("lora_A", "lora_B"):
            suffix = f".{kind}.weight"
            if name.endswith(suffix):
                mats.setdefault(name[: -len(suffix)], {})[kind] = np.asarray(arr, np.float32)
                break
        else:
            raise ValueError(f"LoRA adapter {path!r}: tensor {key!r} is not a lora_A/lora_B "
                             "weight (embedding adapters, DoRA magnitudes and extra modules "
                             "are not supported)")
    out = {}
    for module, ab in mats.items():
        leaf = module.rsplit(".", 1)[-1]
        if leaf not in lora_mod.TARGET_MODULES:
            raise ValueError(f"LoRA adapter {path!r}: target module {leaf!r} ({module}) is not "
                             f"supported; supported: {', '.join(lora_mod.TARGET_MODULES)}")
        if set(ab) != {"lora_A", "lora_B"}:
            raise ValueError(f"LoRA adapter {path!r}: {module} lacks lora_A or lora_B")
        a, b = ab["lora_A"], ab["lora_B"]
        r = a.shape[0] if a.ndim else 0
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != r or r == 0:
            raise ValueError(f"LoRA adapter {path!r}: {module}: lora_A {a.shape} and lora_B "
                             f"{b.shape} are not [r, in] and [out, r] with r > 0")
        if r > max_rank:
            raise ValueError(f"LoRA adapter {path!r}: rank {r} ({module}) exceeds "
                             f"max_lora_rank={max_rank}; raise max_lora_rank")
        out[module] = (a, b, _scaling(cfg, r))
    if not out:
        raise ValueError(f"LoRA adapter {path!r}: {WEIGHTS} holds no LoRA weights")
    return out


def load_adapter(path: str, targets: list, max_rank: int) -> dict[tuple, tuple]:
    """-> {target module path: (a [In, R], b [R, *Out]) float32} for every target."""
    cfg = read_config(path)
    pieces = read_pieces(path, cfg, max_rank)
    known = {name for t in targets for name in t.parts}
    unknown = sorted(set(pieces) - known)
    if unknown:
        raise ValueError(f"LoRA adapter {path!r}: modules {unknown[:4]} do not exist in the "
                         "base model (an adapter trained for another base model?)")
    return {t.path: lora_mod.slot_values(t, max_rank, pieces) for t in targets}
