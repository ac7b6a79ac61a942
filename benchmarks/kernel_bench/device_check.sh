#!/usr/bin/env bash
# One-shot accelerator check for the ragged paged-attention kernels, meant for ONE
# device call:   bash benchmarks/kernel_bench/device_check.sh gpu|tpu
# (gpu_check.sh and tpu_check.sh call this with their platform).
# 1. tests/kernels_pallas/test_kernels.py with the platform's kernel native
#    (PAGEDJAX_KERNEL_NATIVE=1; the other platform's cases are deselected: they would only
#    run its interpreter);
# 2. the platform's benchmark: gpu: benchmarks/kernel_bench/attention_kernels.py (decode/mixed
#    grid, HBM bandwidth vs peak, JAX's own GPU paged attention on the same decode inputs);
#    tpu: benchmarks/kernel_bench/tpu_attention.py (decode/mixed steps, bf16 and int8 pages);
# 3. benchmarks/kernel_bench/roofline.py: each measured row beside its roofline time on this chip.
# Everything lands in $OUT (default benchmarks/results). Exit status: tests' or bench's.
set -u
PLATFORM=${1:-}
case "$PLATFORM" in
  gpu) DESELECT="not tpu and not mosaic"; BENCH=attention_kernels; BENCH_TAIL=40
       ENV_CMD=nvidia-smi ;;
  tpu) DESELECT="not gpu and not triton"; BENCH=tpu_attention; BENCH_TAIL=20; ENV_CMD=true ;;
  *) echo "usage: $0 gpu|tpu (got '${PLATFORM}')" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ $ENV_CMD; "$PY" -c 'import jax; print(jax.__version__, jax.devices())'; } > "$OUT/env.txt" 2>&1
PAGEDJAX_KERNEL_NATIVE=1 timeout 330 "$PY" -m pytest -q -p no:cacheprovider tests/kernels_pallas/test_kernels.py \
  -k "$DESELECT" --durations=10 --junitxml="$OUT/test_kernels.xml" \
  > "$OUT/test_kernels.log" 2>&1
TEST_RC=$?
timeout 240 "$PY" "benchmarks/kernel_bench/$BENCH.py" ${BENCH_ARGS:-} --json "$OUT/$BENCH.json" \
  > "$OUT/bench.log" 2>&1
BENCH_RC=$?
timeout 60 "$PY" benchmarks/kernel_bench/roofline.py --measured "$OUT/$BENCH.json" \
  --json "$OUT/roofline.json" > "$OUT/roofline.log" 2>&1
tail -n 25 "$OUT/test_kernels.log"
tail -n "$BENCH_TAIL" "$OUT/bench.log"
cat "$OUT/roofline.log"
echo "tests rc=$TEST_RC bench rc=$BENCH_RC (logs in $OUT)"
[ "$TEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
