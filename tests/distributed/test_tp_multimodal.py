"""Vision-language models (tiny LLaVA + SigLIP, tiny Qwen2.5-VL) under TP=2 on forced CPU
devices give transformers' greedy tokens: one and two images, chunks cut inside an
image, a text request in the same batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.utils import vlm
from tests.utils.paths import REPO_ROOT

torch = pytest.importorskip("torch")


def _child(folder: str, kind: str) -> list:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=2"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "tests.distributed.tp_multimodal_child",
                           folder, "2", kind], capture_output=True, text=True, env=env,
                          cwd=str(REPO_ROOT), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_llava_tp2_matches_transformers(tmp_path):
    from tests.engine.test_multimodal import hf_greedy

    folder = str(tmp_path)
    hf_model = vlm.save_tiny_llava(folder)
    tokens = _child(folder, "llava")
    imgs = [vlm.random_image(60), vlm.random_image(61)]
    assert tokens[0] == hf_greedy(folder, hf_model, [1, 5, vlm.IMAGE_TOKEN, 7], imgs[:1], 5)
    assert tokens[1] == hf_greedy(folder, hf_model, [1, vlm.IMAGE_TOKEN, 6, vlm.IMAGE_TOKEN],
                                  imgs, 5)
    assert tokens[2] == hf_greedy(folder, hf_model, [1, 20, 21, 22], [], 5)


def test_qwen2_5_vl_tp2_matches_transformers(tmp_path):
    from tests.distributed.tp_multimodal_child import qwen_prompts
    from tests.utils import qwen_vl as Q

    folder = str(tmp_path)
    hf_model = Q.save_tiny_qwen_vl(folder)
    tokens = _child(folder, "qwen")
    for got, p in zip(tokens, qwen_prompts()):
        images = p.get("multi_modal_data", {}).get("image", [])
        images = images if isinstance(images, list) else [images]
        if not images:
            with torch.no_grad():
                out = hf_model.generate(input_ids=torch.tensor([p["prompt_token_ids"]]),
                                        max_new_tokens=5, do_sample=False)
            assert got == out[0, len(p["prompt_token_ids"]):].tolist()
            continue
        inputs = Q.hf_inputs(images)
        counts = iter(Q.tokens_of(g) for g in inputs["image_grid_thw"])
        ids = [x for t in p["prompt_token_ids"]
               for x in ([t] * next(counts) if t == Q.IMAGE_TOKEN else [t])]
        assert got == Q.hf_greedy(hf_model, ids, inputs, 5)
