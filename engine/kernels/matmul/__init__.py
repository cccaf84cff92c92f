"""Quantized matrix multiplication: LLVM IR builders and a small runtime facade.

    out[m, r] = dot(W[r, :], x[m, :])      W: QuantMatrix [N, K]   x: float32 [M, K]   out: [M, N]

Numerics follow llama.cpp: each call quantizes the activations once (per row, to 8-bit blocks:
q8_0 for Q8_0 and IQ4_NL, q8_1 for Q4_0/Q4_1/Q5_0/Q5_1, q8_k for the K-quants and IQ4_XS;
engine/formats/activations.py has the layouts, engine/formats/quants.py says why Q4_0/Q5_0 differ from
llama.cpp; each type's record in engine.formats.quants.TYPES names its format), then takes integer dot
products block by block and scales them by float block scales. F32, F16 and BF16 weights use f32
activations and FMA. A row's arithmetic never depends on the other rows of the batch or on the
thread split, so each output row is bit-identical however the call is batched or split.

IR builders are pure (type in, IR text out). Each module holds, for one weight type:
    quantize_<act>(x, xq, nb, r0, r1, M)              rows [r0, r1) of f32 [M, K] -> packed blocks
    rows_<type>(w, xq, out, nb, r0, r1, M, N)         weight rows [r0, r1) against M rows
    matmul_<type>(w, x, xq, out, nb, M, N)            both, all rows (the one-thread path)
(float types: rows_<type>(w, x, out, K, r0, r1, M, N) and no quantizer.) The packed activations
(engine.formats.activations.pack_activations) keep q8_0/q8_1 rows in pairs and each block's scales of 8
rows side by side, so a tile of rows takes them with vector loads; threads quantize disjoint row
ranges into the one buffer. Callers must pass 0 <= r0 <= r1 <= N and valid buffers; the facade
MatmulKernels checks all that. With AVX-512 the legacy types take two rows per 512-bit vector.

The modules, one job each, over the one IR library engine.kernels.ir (KernelFn, the intrinsics,
IntOps: the u8 x s8 dot products of each ISA entry, AVX2, VNNI or portable IR, the same integers):
    loops.py      the loop nest all rows_* share: weight rows x tiles of activation rows
    quantizer.py  quantize_<act> and the packed q8_0/q8_1 addressing
    legacy.py     Q4_0 .. Q8_0 and IQ4_NL tiles (32-value blocks)
    kquants.py    Q2_K .. Q6_K tiles          iquants.py   IQ4_XS tiles
    floats.py     F32, F16, BF16 rows
    build.py      build_matmul_ir: a type's record (engine.formats.quants.TYPES) -> its tile family
    facade.py     MatmulKernels: compile, scratch, thread split
    reference.py  matmul_reference, the numpy twin
"""
from engine.kernels.matmul.build import FAMILIES, build_matmul_ir
from engine.kernels.matmul.facade import MIN_SPLIT_BYTES, MatmulKernels, TypeKernels
from engine.kernels.matmul.loops import NARROW_TILES, PREFETCH_BYTES, TILES
from engine.kernels.matmul.quantizer import build_quantize_ir
from engine.kernels.matmul.reference import matmul_reference

__all__ = ["FAMILIES", "MIN_SPLIT_BYTES", "NARROW_TILES", "PREFETCH_BYTES", "TILES", "MatmulKernels",
           "TypeKernels", "build_matmul_ir", "build_quantize_ir", "matmul_reference"]
