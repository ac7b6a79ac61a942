"""Benchmarks that ship with pagedjax (`pagedjax bench throughput`) and their shared pieces: workloads, machine facts, the fresh-process baselines."""
