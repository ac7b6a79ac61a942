"""Parallelism: the device mesh and sharding rules (tensor parallel), multi-host runs."""
