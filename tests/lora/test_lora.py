"""LoRA at the model level: our slot tables against PEFT's own PyTorch models.

Tiny random transformers models get PEFT adapters with random non-zero A and B
(PEFT initialises B to zero); one batch mixes rows of two adapters (different
ranks, one with rsLoRA scaling) and the base model, each compared with the
matching PEFT / transformers model. Tolerance as in tests/models/test_models.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pagedjax.models as models  # noqa: E402
from pagedjax.models.lora import LoRASpec  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402
from pagedjax.lora.adapter import load_adapter  # noqa: E402
from pagedjax.lora.device import SlotWriter, init_tables  # noqa: E402
from tests.utils.lora import make_adapter, tiny_hf_model, torch_logits  # noqa: E402

RTOL_SCALE = 2e-4
TARGETS = {"llama": None, "qwen2": None,
           "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}


def assert_close(ours, ref, what=""):
    tol = RTOL_SCALE * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(np.asarray(ours) - ref).max())
    assert err <= tol, f"{what}: max |diff| {err:.3g} > tol {tol:.3g}"


@pytest.mark.parametrize("arch", list(TARGETS))
def test_mixed_adapters_match_peft(arch, tmp_path):
    base = tiny_hf_model(arch, seed=3)
    base.save_pretrained(tmp_path / "base")
    targets = TARGETS[arch]
    peft1 = make_adapter(base, str(tmp_path / "a1"), seed=11, r=4, alpha=8, targets=targets)
    peft2 = make_adapter(base, str(tmp_path / "a2"), seed=12, r=8, alpha=4, targets=targets,
                         rslora=True)
    if targets is None:  # q and v only: the fused q/k/v table keeps k's part zero
        peft3 = make_adapter(base, str(tmp_path / "a3"), seed=13, r=2, alpha=2,
                             targets=["q_proj", "v_proj"])

    model, params = models.load_model(str(tmp_path / "base"), dtype="float32")
    model = model.with_lora(LoRASpec(max_loras=3, max_rank=8))
    params = init_tables(model, params)
    writer = SlotWriter()
    # Slot 2 holds adapter 1, slot 0 adapter 2 (slots are not ids).
    params = writer.write(params, 2, load_adapter(str(tmp_path / "a1"), model.lora_targets, 8))
    params = writer.write(params, 0, load_adapter(str(tmp_path / "a2"), model.lora_targets, 8))
    rows = [("a1", 2, peft1), ("base", -1, base), ("a2", 0, peft2)]
    if targets is None:
        params = writer.write(params, 1, load_adapter(str(tmp_path / "a3"),
                                                      model.lora_targets, 8))
        rows.append(("a3", 1, peft3))

    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 96, 9 + 2 * i)] for i in range(len(rows))]
    chunks, start, slots = [], 1, []
    for p in prompts:
        n_pages = -(-len(p) // 4)
        chunks.append(SeqChunk(list(range(start, start + n_pages)), 0, len(p)))
        start += n_pages
    for (_, slot, _), p in zip(rows, prompts):
        slots += [slot] * len(p)
    meta = build_metadata(chunks, 4, pad_tokens_to=64, pad_seqs_to=4)
    lora = np.full(64, -1, np.int32)
    lora[:len(slots)] = slots
    meta = dataclasses.replace(meta, lora_slots=jnp.asarray(lora))
    ids = np.zeros(64, np.int32)
    ids[:len(slots)] = np.concatenate(prompts)
    kv = model.allocate_kv_caches(start + 1, 4)
    hidden, _ = jax.jit(model.forward)(params, kv, jnp.asarray(ids), meta)
    logits = np.asarray(model.compute_logits(params, hidden))
    off = 0
    for (name, _, ref_model), p in zip(rows, prompts):
        ref = torch_logits(ref_model, p)
        assert_close(logits[off:off + len(p)], ref, f"{arch} {name}")
        off += len(p)
    # The adapters really change the logits (the test could fail).
    assert np.abs(torch_logits(peft1, prompts[0]) - torch_logits(base, prompts[0])).max() > 0.1
