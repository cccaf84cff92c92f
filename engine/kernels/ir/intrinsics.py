"""The LLVM intrinsics the textual-IR kernels call, declared once here. A module declares the
ones its family names (declarations(...)), in the order it names them, so each family's IR
text stays what it was."""
from __future__ import annotations

_SIGNATURES = """
void @llvm.prefetch.p0(ptr, i32, i32, i32)
<8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)
<4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)
<2 x float> @llvm.fma.v2f32(<2 x float>, <2 x float>, <2 x float>)
<1 x float> @llvm.fma.v1f32(<1 x float>, <1 x float>, <1 x float>)
float @llvm.fma.f32(float, float, float)
<16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
float @llvm.vector.reduce.fmax.v32f32(<32 x float>)
float @llvm.maxnum.f32(float, float)
<32 x float> @llvm.fabs.v32f32(<32 x float>)
float @llvm.fabs.f32(float)
<32 x float> @llvm.roundeven.v32f32(<32 x float>)
i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)
i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)
i32 @llvm.vector.reduce.add.v8i32(<8 x i32>)
<64 x i8> @llvm.abs.v64i8(<64 x i8>, i1)
<16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)
<8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
<32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)
<32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8>, <32 x i8>)
<8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <8 x i32>, <8 x i32>)
<16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
<8 x i32> @llvm.x86.avx512.vpdpwssd.256(<8 x i32>, <8 x i32>, <8 x i32>)
<16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32>, <16 x i32>, <16 x i32>)
<64 x i8> @llvm.x86.avx512.pshuf.b.512(<64 x i8>, <64 x i8>)
"""
# name -> "declare <signature>"
INTRINSICS: dict[str, str] = {
    line.split("@", 1)[1].split("(", 1)[0]: f"declare {line}"
    for line in _SIGNATURES.strip().splitlines()
}


def declarations(*names: str) -> str:
    """The declare lines of these intrinsics, in this order, as one block of module text."""
    return "\n" + "".join(INTRINSICS[n] + "\n" for n in names)
