"""LayerNorm of float32 rows (ggml_norm, then * w + b), 16 lanes at a time: the vision encoder's
[n_pos, width] activations (width a multiple of 16), where numpy's six passes cost ~4% of a
SigLIP block.

    per row:  mean = sum(x) / n;  d = x - mean;  var = sum(d * d) / n
              out = d * (1 / sqrt(var + eps)) * w + b

Sums are f32 in 16 lanes (numpy's twin, engine.vision.encoder.layer_norm, sums in f64: they
agree to ~1e-6 relative on activations; a row whose mean dwarfs its spread loses more, as its
f32 values already have). Rows are independent, so callers split them across threads.
"""
from __future__ import annotations

import ctypes

import numpy as np

from engine.kernels import jit
from engine.kernels.ir.builder import address
from engine.kernels.ir.consts import V16F
from engine.kernels.ir.vectors import KernelFn

LANES = 16
_DECLS = "declare float @llvm.vector.reduce.fadd.v16f32(float, <16 x float>)\n" \
         "declare float @llvm.sqrt.f32(float)\n"


def build_ir() -> str:
    f = KernelFn("void @layer_norm16(ptr noalias %x, ptr noalias %w, ptr noalias %b, "
                 "ptr noalias %out, i64 %n_rows, i64 %n, float %eps) #0")
    n_vec = f.let(f"udiv i64 %n, {LANES}")
    row_bytes = f.mul("%n", 4)
    n_f = f.let("uitofp i64 %n to float")

    def row(i: str) -> None:
        xr = f.gep("%x", f.mul(i, row_bytes))
        orow = f.gep("%out", f.mul(i, row_bytes))

        def total(v: str) -> str:
            return f.let(f"call reassoc float @llvm.vector.reduce.fadd.v16f32(float -0.0, {V16F} {v})")

        def add(j: str, c: list[str]) -> list[str]:
            return [f.let(f"fadd {V16F} {c[0]}, {f.load(V16F, xr, f.mul(j, 64), 4)}")]

        mean = f.splat_float(f.let(f"fdiv float {total(f.loop(n_vec, [(V16F, 'zeroinitializer')], add)[0])}, {n_f}"), LANES)

        def square(j: str, c: list[str]) -> list[str]:
            d = f.let(f"fsub {V16F} {f.load(V16F, xr, f.mul(j, 64), 4)}, {mean}")
            return [f.fma(LANES, d, d, c[0])]

        var = f.let(f"fdiv float {total(f.loop(n_vec, [(V16F, 'zeroinitializer')], square)[0])}, {n_f}")
        root = f.let(f"call float @llvm.sqrt.f32(float {f.let(f'fadd float {var}, %eps')})")
        scale = f.splat_float(f.let(f"fdiv float 1.0, {root}"), LANES)

        def write(j: str) -> None:
            off = f.mul(j, 64)
            d = f.let(f"fsub {V16F} {f.load(V16F, xr, off, 4)}, {mean}")
            y = f.let(f"fmul {V16F} {d}, {scale}")
            y = f.fma(LANES, y, f.load(V16F, "%w", off, 4), f.load(V16F, "%b", off, 4))
            f.store(V16F, y, orow, off, 4)

        f.each(n_vec, write)

    f.each("%n_rows", row)
    f.do("ret void")
    return (_DECLS + "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)\n"
            + f.text() + 'attributes #0 = { "min-legal-vector-width"="512" }\n')


_fn: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]


def layer_norm_rows(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float,
                    out: np.ndarray | None = None) -> np.ndarray:
    """LayerNorm of each row of C-contiguous float32 x [rows, n] (n % 16 == 0) with weight and
    bias float32 [n]; into `out` (x's shape; may be x). Releases the GIL while it runs."""
    global _fn
    if x.dtype != np.float32 or x.ndim != 2 or not x.flags.c_contiguous or x.shape[1] % LANES:
        raise ValueError(f"layer_norm_rows takes C-contiguous float32 [rows, 16 k], got {x.dtype} {x.shape}")
    n = x.shape[1]
    for name, v in (("w", w), ("b", b)):
        if v.shape != (n,) or v.dtype != np.float32 or not v.flags.c_contiguous:
            raise ValueError(f"{name} must be contiguous float32 [{n}]")
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {x.shape}")
    if _fn is None:
        lib = jit.compile_cached("layer_norm", (LANES,), build_ir)
        _fn = lib.function("layer_norm16", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_float)
    if x.size:
        _fn(address(x), address(w), address(b), address(out), x.shape[0], n, eps)
    return out
