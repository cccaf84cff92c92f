"""The numpy twin of the row-interleaved kernels (engine.kernels.gemm): what they compute, from
the weights' and activations' definitions (engine.formats), in float64."""
from __future__ import annotations

import numpy as np

from engine.formats.activations import dequantize_activations, quantize_activations
from engine.formats.quants import QuantMatrix, dequantize
from engine.formats.repack import ACTIVATION, GGML_ACT, RepackedMatrix
from engine.kernels.matmul.reference import matmul_reference


def reference(w: QuantMatrix | RepackedMatrix, x: np.ndarray) -> np.ndarray:
    """dequantize(W) @ (activations as the kernel sees them).T in float64, returned as float32
    [M, N]."""
    src = w.source if isinstance(w, RepackedMatrix) else w
    x = np.asarray(x, np.float32)
    act = GGML_ACT[ACTIVATION[src.qtype]]
    if act == "q8_1":  # the offsets go through q8_1's stored s, as the file layout's twin says
        return matmul_reference(src, x)
    xs = dequantize_activations(quantize_activations(x, act), act, src.n_cols).astype(np.float64)
    wd = dequantize(src.raw, src.qtype, src.n_cols).astype(np.float64)
    return (xs @ wd.T).astype(np.float32)
