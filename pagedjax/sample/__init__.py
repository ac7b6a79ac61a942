"""Sampling: the on-device sampler and the host-side per-row sampling metadata it reads."""
