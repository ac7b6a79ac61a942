#!/usr/bin/env bash
# One-shot TPU check for the Mosaic ragged paged-attention kernel, meant for ONE
# device call:   bash benchmarks/kernel_bench/tpu_check.sh
# 1. tests/kernels_pallas/test_kernels.py with the Mosaic kernel native (PAGEDJAX_KERNEL_NATIVE=1;
#    the GPU-kernel cases are deselected: they would only run its interpreter);
# 2. benchmarks/kernel_bench/tpu_attention.py (decode/mixed steps, bf16 and int8 pages);
# 3. benchmarks/kernel_bench/roofline.py: each measured row beside its roofline time on this chip.
# Everything lands in $OUT (default benchmarks/results). Exit status: tests' or bench's.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import jax; print(jax.__version__, jax.devices())' > "$OUT/env.txt" 2>&1
PAGEDJAX_KERNEL_NATIVE=1 timeout 330 "$PY" -m pytest -q -p no:cacheprovider tests/kernels_pallas/test_kernels.py \
  -k "not gpu and not triton" --durations=10 --junitxml="$OUT/test_kernels.xml" \
  > "$OUT/test_kernels.log" 2>&1
TEST_RC=$?
timeout 240 "$PY" benchmarks/kernel_bench/tpu_attention.py ${BENCH_ARGS:-} --json "$OUT/tpu_attention.json" \
  > "$OUT/bench.log" 2>&1
BENCH_RC=$?
timeout 60 "$PY" benchmarks/kernel_bench/roofline.py --measured "$OUT/tpu_attention.json" \
  --json "$OUT/roofline.json" > "$OUT/roofline.log" 2>&1
tail -n 25 "$OUT/test_kernels.log"
tail -n 20 "$OUT/bench.log"
cat "$OUT/roofline.log"
echo "tests rc=$TEST_RC bench rc=$BENCH_RC (logs in $OUT)"
[ "$TEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
