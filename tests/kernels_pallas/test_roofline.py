"""Roofline counts (kernels_pallas/pallas/roofline.py) against hand counts."""

from __future__ import annotations

import pytest

from pagedjax.kernels_pallas.pallas import roofline as rl


def test_decode_attention_bytes_and_flops_by_hand():
    # 2 decode rows, contexts 10 and 20; 4 query heads over 2 KV heads of 8; bf16.
    c = rl.attention([1, 1], [10, 20], hq=4, hkv=2, d=8, kv_itemsize=2)
    kv = 2 * (10 + 20) * 2 * 8 * 2  # K and V rows of both KV heads
    qo = 2 * 2 * 4 * 8 * 2  # q in, out out
    assert c.bytes == kv + qo
    assert c.flops == 4 * 4 * 8 * (10 + 20)


def test_prefill_is_causal_and_window_limits_keys():
    c = rl.attention([4], [4], hq=1, hkv=1, d=1, kv_itemsize=2)
    assert c.flops == 4 * (1 + 2 + 3 + 4)
    w = rl.attention([4], [4], hq=1, hkv=1, d=1, kv_itemsize=2, window=2)
    assert w.flops == 4 * (1 + 2 + 2 + 2)
    assert w.bytes < rl.attention([1], [100], hq=1, hkv=1, d=1, kv_itemsize=2).bytes


def test_quantized_pages_count_their_scales():
    bf16 = rl.attention([1], [100], hq=8, hkv=8, d=128, kv_itemsize=2)
    int8 = rl.attention([1], [100], hq=8, hkv=8, d=128, kv_itemsize=1, quantized=True)
    qo = 2 * 1 * 8 * 128 * 2
    assert bf16.bytes == 2 * 100 * 8 * 128 * 2 + qo
    assert int8.bytes == 2 * 100 * (8 * 128 + 8 * 4) + qo  # 1-byte values + f32 scales


def test_seconds_is_the_slower_of_bandwidth_and_compute():
    chip = rl.CHIPS["H100"]
    mem = rl.Cost(chip.hbm_bytes_per_s, 1.0)
    assert mem.seconds(chip) == pytest.approx(1.0)
    flop = rl.Cost(1.0, chip.bf16_flops_per_s * 2)
    assert flop.seconds(chip) == pytest.approx(2.0)
    assert mem.seconds(chip, tp=4) == pytest.approx(0.25)


def test_decode_step_is_weight_bound_at_batch_one():
    m = rl.LLAMA_8B
    assert 7.0e9 < m.matmul_params() < 8.1e9  # 8B less the input embedding
    one = rl.decode_step(m, 1, 2048)
    assert one.bytes == pytest.approx(m.weight_bytes_read(), rel=0.02)
    # H100: 15 GB at 3.35 TB/s is about 4.6 ms.
    assert 4.0e-3 < one.seconds(rl.CHIPS["H100"]) < 5.0e-3
    assert rl.decode_step(m, 64, 2048).bytes > one.bytes


def test_roofline_script_prints_measured_beside_expected(tmp_path):
    """benchmarks/kernel_bench/roofline.py --measured, on rows shaped like
    benchmarks/attention_kernels.py's JSON from an H100."""
    import json
    import subprocess
    import sys

    from tests.utils.paths import REPO_ROOT

    measured = dict(device="NVIDIA H100 80GB HBM3", rows=[
        dict(kind="decode", kv_dtype="bf16", batch=64, ctx=2048, hq=32, hkv=8, d=128,
             page_size=16, ms=0.5),
        dict(kind="mixed", kv_dtype="bf16", batch=66, prefill_chunks=2, chunk=512, ctx=2048,
             hq=32, hkv=8, d=128, page_size=16, ms=1.0),
        dict(kind="decode", kv_dtype="int8", batch=8, ctx=512, hq=32, hkv=8, d=128,
             page_size=16, error="RuntimeError: x")])
    src, out = tmp_path / "m.json", tmp_path / "r.json"
    src.write_text(json.dumps(measured))
    proc = subprocess.run([sys.executable, "benchmarks/kernel_bench/roofline.py", "--measured",
                           str(src), "--json", str(out)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Measured on NVIDIA H100" in proc.stdout
    rows = json.loads(out.read_text())["measured"]["rows"]
    assert [r["kind"] for r in rows] == ["decode", "mixed"]  # the failed row is left out
    dec = rl.attention([1] * 64, [2048] * 64, hq=32, hkv=8, d=128, kv_itemsize=2)
    assert rows[0]["expected_ms"] == pytest.approx(dec.seconds(rl.CHIPS["H100"]) * 1e3)
    assert rows[0]["of_roofline"] == pytest.approx(rows[0]["expected_ms"] / 0.5)


def test_grouped_matmul_reads_each_block_s_expert_once():
    # 3 experts with 5, 0 and 20 rows; blocks of 16: 1 + 0 + 2 blocks.
    c = rl.grouped_matmul([5, 0, 20], k=8, n=4, block=16, itemsize=2)
    assert c.bytes == 3 * 8 * 4 * 2 + 25 * (8 + 4) * 2
    assert c.flops == 2 * 3 * 16 * 8 * 4
    assert rl.routed_rows(4, 128, 8) == [1] * 32  # 32 rows, 32 experts touched
    assert rl.routed_rows(64, 8, 2) == [16] * 8
    assert sum(rl.routed_rows(10, 3, 2)) == 20
