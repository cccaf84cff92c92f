"""Float32 values rounded to f16 and back, 16 lanes at a time: the activations an F16 weight
multiplies (ggml converts a matmul's float input to its F16 weight's dot type first), for
callers whose GEMM reads float32 inputs (the encoder's panel GEMM). numpy's astype pair runs
~10x slower here (no vectorised f16 cast).

    out[i] = float(half(x[i]))    round to nearest even, as numpy and F16C do

Numpy twin: `reference`. Elementwise, so callers split rows across threads.
"""
from __future__ import annotations

import ctypes

import numpy as np

from engine.kernels import jit
from engine.kernels.ir.builder import address
from engine.kernels.ir.consts import V16F
from engine.kernels.ir.vectors import KernelFn

LANES = 16


def build_ir() -> str:
    f = KernelFn("void @round_f16_16(ptr noalias %x, ptr noalias %out, i64 %n_vec) #0")

    def one(j: str) -> None:
        off = f.mul(j, 64)
        h = f.let(f"fptrunc {V16F} {f.load(V16F, '%x', off, 4)} to <16 x half>")
        f.store(V16F, f.let(f"fpext <16 x half> {h} to {V16F}"), "%out", off, 4)

    f.each("%n_vec", one)
    f.do("ret void")
    return f.text() + 'attributes #0 = { "min-legal-vector-width"="512" }\n'


def reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond f16's range: inf, as the conversion gives
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


_fn: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]


def round_f16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """C-contiguous float32 x rounded to f16 values, into `out` (x's shape; may be x). Releases
    the GIL while it runs."""
    global _fn
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(f"round_f16 takes C-contiguous float32, got {x.dtype}")
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {x.shape}")
    if _fn is None:
        lib = jit.compile_cached("f16_round", (LANES,), build_ir)
        _fn = lib.function("round_f16_16", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    flat, flat_out = x.reshape(-1), out.reshape(-1)
    n_vec = flat.size // LANES
    if n_vec:
        _fn(address(flat), address(flat_out), n_vec)
    tail = n_vec * LANES
    flat_out[tail:] = reference(flat[tail:])
    return out
