"""Pallas paged-attention kernels for accelerators: Triton (NVIDIA GPU) and Mosaic (TPU)."""
