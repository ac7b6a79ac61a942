#!/usr/bin/env bash
# One-shot TPU check (tests natively, the Mosaic benchmark, measured vs roofline):
# benchmarks/kernel_bench/device_check.sh with the platform tpu.
exec bash "$(dirname "$0")/device_check.sh" tpu "$@"
