"""The image programs of a vision-language runner: the vision encoder (one program
per static patch bucket) and the gather of a step's image rows (one program per
token bucket T and encoder output size R), with their warm-up jobs.

    progs = ImagePrograms(model, plan, hidden_size, dtype, pool=lambda: runner.compile_pool)
    rows = progs.encode(params, item.data)                 # [R, H] on the device
    mm = progs.step_inputs(pieces, T)                       # (rows [T, H], source i32[T])

Every step of a vision-language model passes ``mm`` (zeros and source -1 when no
token is an image's), so the model program of a step shape is one program; the
warm-up (``worker/warmup.py``) compiles the encoder at every patch bucket the image
processor can produce and the gather at every (T, R), and the runner's calls ask
the background compile pool for them by the same keys.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def _place(buf, entry, idx, take):
    """Tokens with ``take`` read row ``idx`` of ``entry``; the others keep ``buf``."""
    return jnp.where(take[:, None], jnp.take(entry, idx, axis=0).astype(buf.dtype), buf)


def _input_key(inputs) -> tuple:
    return tuple((tuple(np.shape(a)), str(np.asarray(a).dtype)) for a in jax.tree.leaves(inputs))


class ImagePrograms:
    def __init__(self, model, plan, hidden_size: int, dtype, pool=lambda: None):
        self.model = model
        self.plan = plan
        self.hidden_size = hidden_size
        self.dtype = jnp.dtype(dtype)
        self._encode = jax.jit(self._encode_impl, static_argnames=("plan",))
        self._place = jax.jit(_place)
        self._zeros: dict[int, jax.Array] = {}
        self.pool = pool  # () -> the runner's background CompilePool, or None

    def _encode_impl(self, params, inputs, plan):
        out = self.model.encode_images(params, inputs, plan)
        return out.reshape(-1, out.shape[-1]).astype(self.dtype)

    # ------------------------------------------------------------------ calls
    def encode(self, params, data) -> jax.Array:
        """One image's encoder data (``MMItem.data``) -> its rows [R, H] (R >= its
        placeholder tokens: the patch bucket's rows)."""
        inputs = self.model.encoder_inputs(data)
        if self.pool() is not None:
            self.pool().need(("encoder", _input_key(inputs)))
        return self._encode(params, inputs, plan=self.plan)

    def zeros(self, t: int) -> jax.Array:
        z = self._zeros.get(t)
        if z is None:
            # Uncommitted (no device named), like the other step inputs: a committed
            # argument would commit the step's outputs and change every program's key.
            z = self._zeros[t] = jax.device_put(np.zeros((t, self.hidden_size), self.dtype))
        return z

    def step_inputs(self, pieces: Sequence[tuple], t: int) -> tuple:
        """(rows [t, H] device array, source i32[t]): token i reads row i where
        source[i] >= 0. ``pieces``: ``mm_inputs.step_pieces``."""
        buf = self.zeros(t)
        src = np.full(t, -1, np.int32)
        for entry, at, rows in pieces:
            idx = np.zeros(t, np.int32)
            take = np.zeros(t, bool)
            idx[at], take[at] = rows, True
            if self.pool() is not None:
                self.pool().need(("place", t, int(entry.shape[0])))
            buf = self._place(buf, entry, idx, take)
            src[at] = at
        return buf, src

    # ------------------------------------------------------------------ warm-up
    def encoder_jobs(self, params, examples: Sequence[Any]) -> dict:
        """{("encoder", key): job} for each example encoder data, and the rows R each
        bucket's output has (``jobs, rows``)."""
        jobs, rows = {}, set()
        for data in examples:
            inputs = self.model.encoder_inputs(data)
            key = ("encoder", _input_key(inputs))
            out = jax.eval_shape(functools.partial(self._encode_impl, plan=self.plan),
                                 params, inputs)
            rows.add(int(out.shape[0]))
            jobs.setdefault(key, functools.partial(self._lower_encoder, params, inputs))
        return jobs, sorted(rows)

    def _lower_encoder(self, params, inputs):
        return self._encode.lower(params, inputs, plan=self.plan).compile()

    def place_jobs(self, token_buckets: Sequence[int], rows: Sequence[int]) -> dict:
        """{("place", T, R): job} for every token bucket T and encoder output size R."""
        jobs = {}
        for t in token_buckets:
            for r in rows:
                jobs[("place", t, r)] = functools.partial(self._lower_place, t, r)
        return jobs

    def _lower_place(self, t: int, r: int):
        idx = np.zeros(t, np.int32)
        return self._place.lower(self.zeros(t), self.zeros(r), idx, np.zeros(t, bool)).compile()
