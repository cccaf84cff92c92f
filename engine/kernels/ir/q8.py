"""The steps of ggml's 8-bit activation quantization (q8_0 / q8_1 / q8_k: d = max|x| / 127,
q = roundeven(x * (127 / max|x|))) in IR, for both families' quantizers (matmul/quantizer.py
lays the blocks out for the row-wise kernels, gemm's quantizer for the interleaved ones).
`align` is what the caller can promise of the f32 rows it reads."""
from __future__ import annotations

from engine.kernels.ir.text import IRFunction


def absmax(f: IRFunction, src: str, n_chunks: int, align: int = 1) -> str:
    """max |x| over n_chunks * 32 floats at src."""
    amax = None
    for c in range(n_chunks):
        v = f.load("<32 x float>", src, 128 * c, align)
        a = f.let(f"call <32 x float> @llvm.fabs.v32f32(<32 x float> {v})")
        m = f.let(f"call float @llvm.vector.reduce.fmax.v32f32(<32 x float> {a})")
        amax = m if amax is None else f.let(f"call float @llvm.maxnum.f32(float {amax}, float {m})")
    assert amax is not None
    return amax


def quantize_chunk(f: IRFunction, src: str, dst: str, inv: str, align: int = 1) -> str:
    """32 floats at src times inv, rounded half to even, stored as 32 i8 at dst; returns them
    as <32 x i32>."""
    v = f.load("<32 x float>", src, 0, align)
    s = f.let(f"fmul <32 x float> {v}, {f.splat_float(inv, 32)}")
    r = f.let(f"call <32 x float> @llvm.roundeven.v32f32(<32 x float> {s})")
    q = f.let(f"fptosi <32 x float> {r} to <32 x i32>")
    f.store("<32 x i8>", f.let(f"trunc <32 x i32> {q} to <32 x i8>"), dst)
    return q


def round_to_half(f: IRFunction, x: str) -> str:
    """x rounded to the nearest f16 value, kept as f32 (ggml stores q8_1's d and s as f16).

    Beyond f16's range ggml's value would be inf; the f32 slot keeps x itself instead, so a
    huge activation block stays finite (and equal to llama.cpp wherever llama.cpp is finite;
    engine.formats.activations._round_to_half is its twin).
    """
    r = f.let(f"fpext half {f.let(f'fptrunc float {x} to half')} to float")
    big = f.let(f"fcmp ogt float {f.let(f'call float @llvm.fabs.f32(float {x})')}, 65504.0")
    return f.let(f"select i1 {big}, float {x}, float {r}")
