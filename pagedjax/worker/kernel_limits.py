"""The quantized-weight C++ kernels' row limits, measured against the models' own paths.

``kernels_pallas/cpu/quant_rows.py`` does the measuring and caching; the models'
float32 and dequantizing matmuls it compares against come from here (the
kernels package does not import the models).
"""

from __future__ import annotations

import jax.numpy as jnp

from pagedjax.models.base import ExecutionPlan


def quant_kernel_choice(kernel: str, native_rows: int | None = None) -> dict:
    """A quantized-weight C++ kernel's row limit on this machine ("block": GGUF blocks,
    "int8": per-channel int8) and whether it beats float32 weights at every row count
    ({"rows", "default"}; measured once per machine against the models' own paths,
    kernels_pallas/cpu/quant_rows.py)."""
    from pagedjax.kernels_pallas.cpu import quant_rows
    from pagedjax.models import layers as L, quant as Q

    if native_rows is None:
        from pagedjax.kernels_pallas.cpu import matmul_rows as cpu_matmul_rows, native as cpu_native

        native_rows = cpu_matmul_rows.native_matmul_rows() if cpu_native.fast_matmul() else 0
    plan = ExecutionPlan(attn_backend="cpu_native", native_matmul_rows=native_rows)

    def float_matmul(x, w):
        return L.matmul(x, w, plan)

    def dequantize(kind, comps):
        return Q.dequantize(kind, comps, 0, jnp.float32)

    def quant_matmul(kind, x, comps):  # models/nn.py's jnp paths for quantized weights
        if Q.chunked(x.shape[0], None):
            return Q.chunked_matmul(kind, comps, x, float_matmul)
        return float_matmul(x, dequantize(kind, comps))

    head = None
    if kernel == "block":  # models/nn.py's Embed.attend paths for a tied Q8_0 table
        from pagedjax.kernels_pallas.cpu import blockmatmul

        def float_matmul_t(x, w):
            return L.matmul(x, w, plan, transposed=True)

        head = {"cpp": lambda x, c: blockmatmul.blockmatmul("q8_0", c, x, transposed=True),
                "jnp": lambda x, c: (Q.chunked_matmul_t("q8_0", c, x, float_matmul_t)
                                     if Q.chunked(x.shape[0], None) else
                                     float_matmul_t(x, Q.dequantize("q8_0", c, -1, x.dtype))),
                "float": float_matmul_t,
                "dequantize": lambda c: Q.dequantize("q8_0", c, -1, jnp.float32)}
    return quant_rows.kernel_rows(kernel, lambda: quant_rows.measure(
        kernel, dequantize, quant_matmul, float_matmul, head=head))
