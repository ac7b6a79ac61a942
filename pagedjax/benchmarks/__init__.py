"""Benchmarks that ship with the package (``pagedjax bench ...``)."""
