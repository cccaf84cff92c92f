"""matmul_reference: the numpy twin of MatmulKernels.matmul, from the type records alone."""
from __future__ import annotations

import numpy as np

from engine.formats.activations import ACTIVATION_LAYOUTS, dequantize_activations, quantize_activations
from engine.formats.quants import QuantMatrix, dequantize, quant_type


def matmul_reference(w: QuantMatrix, x: np.ndarray) -> np.ndarray:
    """Numpy twin of MatmulKernels.matmul: dequantize(W) @ (activations as the kernel sees
    them).T, in float64, returned as float32 [M, N]."""
    x = np.asarray(x, dtype=np.float32)
    act = quant_type(w.qtype).act
    if act is None:
        xs = x
    else:
        blocks = quantize_activations(x, act)  # [M, row bytes], ggml's blocks
        xs = dequantize_activations(blocks, act, w.n_cols)
    wd = dequantize(w.raw, w.qtype, w.n_cols).astype(np.float64)  # [N, K]
    y = xs.astype(np.float64) @ wd.T                               # [M, N]
    if act == "q8_1":
        # The kernel adds each weight block's offset (m, or -8d / -16d) times the activation
        # block's stored s = f16(d * sum(q)), not times the exact d * sum(q) that xs implies.
        b = blocks.view(ACTIVATION_LAYOUTS[act]).reshape(x.shape[0], -1)   # [M, nb]
        delta = b["s"].astype(np.float64) - (b["d"].astype(np.float64)
                                             * b["qs"].astype(np.int64).sum(axis=-1))
        y += delta @ _block_offsets(w).T
    return y.astype(np.float32)


def _block_offsets(w: QuantMatrix) -> np.ndarray:
    """float64 [N, nb]: the constant each 32-block of a Q4_0/Q4_1/Q5_0/Q5_1 row adds per value."""
    t = quant_type(w.qtype)
    b = w.raw.view(t.layout).reshape(w.n_rows, -1)
    if t.has("m"):
        return b["m"].astype(np.float64)
    return t.zero * b["d"].astype(np.float64)
