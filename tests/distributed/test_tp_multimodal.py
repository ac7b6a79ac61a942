"""A vision-language model (tiny LLaVA + SigLIP) under TP=2 on forced CPU devices gives
transformers' greedy tokens: one and two images, chunks cut inside an image, a text
request in the same batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.utils import vlm
from tests.utils.paths import REPO_ROOT

torch = pytest.importorskip("torch")


def test_llava_tp2_matches_transformers(tmp_path):
    from tests.engine.test_multimodal import hf_greedy

    folder = str(tmp_path)
    hf_model = vlm.save_tiny_llava(folder)
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=2"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "tests.distributed.tp_multimodal_child",
                           folder, "2"], capture_output=True, text=True, env=env,
                          cwd=str(REPO_ROOT), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tokens = json.loads(proc.stdout.strip().splitlines()[-1])
    imgs = [vlm.random_image(60), vlm.random_image(61)]
    assert tokens[0] == hf_greedy(folder, hf_model, [1, 5, vlm.IMAGE_TOKEN, 7], imgs[:1], 5)
    assert tokens[1] == hf_greedy(folder, hf_model, [1, vlm.IMAGE_TOKEN, 6, vlm.IMAGE_TOKEN],
                                  imgs, 5)
    assert tokens[2] == hf_greedy(folder, hf_model, [1, 20, 21, 22], [], 5)
