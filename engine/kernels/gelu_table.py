"""ggml's GELU as llama.cpp's CPU computes it (GGML_GELU_FP16), 16 lanes at a time: the tanh
GELU read from a table of f16 results indexed by the input rounded to f16, 0 at or below -10,
the input itself at or above 10. The table is the caller's (engine.encoder.gelu_f16_table,
which builds it as ggml does, from gelu in f32), so results equal its numpy twin
engine.encoder.gelu_f16 bit for bit; engine.kernels.ops.gelu_mul computes the same function
with its own polynomial and differs from the table by an f16 step on a few inputs.

    out[i] = x[i] >= 10 ? x[i] : x[i] <= -10 ? 0 : table[bits(half(x[i]))]

Elementwise (a gather per 16 inputs from a 256 KB table that stays in L2), so callers split
rows across threads.
"""
from __future__ import annotations

import ctypes

import numpy as np

from engine.kernels import jit
from engine.kernels.ir.builder import address
from engine.kernels.ir.consts import V16F
from engine.kernels.ir.vectors import KernelFn

LANES = 16
_DECLS = ("declare <16 x float> @llvm.masked.gather.v16f32.v16p0(<16 x ptr>, i32 immarg, "
          "<16 x i1>, <16 x float>)\n")


def build_ir() -> str:
    f = KernelFn("void @gelu_table16(ptr noalias %x, ptr noalias %table, ptr noalias %out, "
                 "i64 %n_vec) #0")
    ones = "<16 x i1> <" + ", ".join(["i1 true"] * LANES) + ">"
    ten = "<" + ", ".join(["float 10.0"] * LANES) + ">"
    minus_ten = "<" + ", ".join(["float -10.0"] * LANES) + ">"

    def one(j: str) -> None:
        off = f.mul(j, 64)
        x = f.load(V16F, "%x", off, 4)
        bits = f.let(f"bitcast <16 x half> {f.let(f'fptrunc {V16F} {x} to <16 x half>')} to <16 x i16>")
        idx = f.let(f"zext <16 x i16> {bits} to <16 x i64>")
        ptrs = f.let(f"getelementptr float, ptr %table, <16 x i64> {idx}")
        y = f.let(f"call {V16F} @llvm.masked.gather.v16f32.v16p0(<16 x ptr> {ptrs}, i32 4, "
                  f"{ones}, {V16F} zeroinitializer)")
        y = f.let(f"select <16 x i1> {f.let(f'fcmp ole {V16F} {x}, {minus_ten}')}, "
                  f"{V16F} zeroinitializer, {V16F} {y}")
        y = f.let(f"select <16 x i1> {f.let(f'fcmp oge {V16F} {x}, {ten}')}, {V16F} {x}, {V16F} {y}")
        f.store(V16F, y, "%out", off, 4)

    f.each("%n_vec", one)
    f.do("ret void")
    return _DECLS + f.text() + 'attributes #0 = { "min-legal-vector-width"="512" }\n'


_fn: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]


def gelu_table(x: np.ndarray, table: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The GELU of C-contiguous float32 x (any shape, size a multiple of 16) from `table`,
    float32 [65536] indexed by f16 bit patterns, into `out` (x's shape; may be x). Releases the
    GIL while it runs."""
    global _fn
    if x.dtype != np.float32 or not x.flags.c_contiguous or x.size % LANES:
        raise ValueError(f"gelu_table takes C-contiguous float32 of 16 k values, got {x.dtype} {x.shape}")
    if table.shape != (1 << 16,) or table.dtype != np.float32 or not table.flags.c_contiguous:
        raise ValueError("table must be contiguous float32 [65536]")
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {x.shape}")
    if _fn is None:
        lib = jit.compile_cached("gelu_table", (LANES,), build_ir)
        _fn = lib.function("gelu_table16", None, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int64)
    if x.size:
        _fn(address(x), address(table), address(out), x.size // LANES)
    return out
