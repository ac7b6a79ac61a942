"""Speculative decoding: proposers (n-gram prompt lookup, draft model), on-device
rejection sampling, and the engine-facing :class:`Speculator`
(``speculator.py``). See docs/speculative_decoding.md."""
