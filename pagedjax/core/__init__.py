"""Host-side bookkeeping: requests, the waiting queue, the scheduler and the KV page pool (no JAX)."""
