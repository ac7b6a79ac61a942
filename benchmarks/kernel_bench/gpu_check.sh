#!/usr/bin/env bash
# One-shot GPU check (tests natively, the attention benchmark, measured vs roofline):
# benchmarks/kernel_bench/device_check.sh with the platform gpu.
exec bash "$(dirname "$0")/device_check.sh" gpu "$@"
