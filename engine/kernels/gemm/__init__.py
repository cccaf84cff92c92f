"""The row-interleaved matmul family (decode and prefill): LLVM IR builders, their facade and
their numpy twin.

    out[m, r] = dot(W[r, :], x[m, :])   W: engine.formats.repack.RepackedMatrix [N, K]   x: [M, K]

Per weight type a module holds
    quantize_<act>(x, xq, nb, r0, r1, M)          rows [r0, r1) of f32 [M, K] -> act rows
    gemm_<type>(w, xq, out, nb, r0, r1, M, N)     weight rows [r0, r1) against all M rows
the same signatures as engine.kernels.matmul's quantize_/rows_ functions, so the task graph
runs either. A thread's rows are rounded up to whole groups of 16 ([ceil16(r0), ceil16(r1)):
consecutive ranges stay disjoint and cover [0, N)), so callers split anywhere.

The loop nest: for each group of 16 weight rows, for each tile of TILES[type] activation rows
(then one smaller tile and single rows), for each block: unpack the 16 rows' block
(registers), then for each tile row take the integer dot products with 4-byte activation
broadcasts (`vpdpbusd` adds four u8 x i8 products into each row's lane), scale and accumulate
per block. A tile's accumulators live in registers; the group's weights stay in L1/L2 while
all M activation rows stream past them, so weights are read from memory once per call. Calls
of one row (decode) go to the nest compiled for single rows alone (gemm_<type>_one). The
K-quants and IQ4_XS sum a whole super-block in integers and keep 2 accumulators per activation
row (Q2_K, Q4_K and Q5_K: the block's and its mins') or 1; for Q4_K, Q5_K and Q6_K those are the
file-layout kernel's float operations in its order (FILE_LAYOUT_BITS). Their bodies read a
block's quants in memory order, which the hardware prefetchers follow.

Instruction selections (the same integers everywhere, so all give the same bits):
  vnni512   `vpdpbusd` / `vpdpwssd` on 512-bit vectors (AVX-512 VNNI + BW)
  avx2      `vpmaddubsw` + `vpmaddwd` per 256-bit half: exact because every u8 weight operand
            of the AVX2 path is < 64 (maddubs never saturates); Q8_0's u8 weights reach 255,
            so Q8_0 has no AVX2 form here (the file-layout kernels serve it)
  portable  the same sums in generic vector IR

The modules, one job each, over engine.kernels.ir (KernelFn, the intrinsics, Dots: the integer
dot products of each ISA entry):
    build.py      build_gemm_ir: the loop nest, per type its body and tile (TILES, LANES)
    legacy.py     the 32-value block types' bodies (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1)
    kquants.py    the super-block types' bodies (Q2_K .. Q6_K, IQ4_XS)
    quantizer.py  quantize_<act> into the r8_0 / r8_1 / r8_k rows, and Act, their addresses
    repack_ir.py  the compiled repacks (engine.formats.repack's numpy repacking is their twin)
    facade.py     GemmKernels: which types and ISA a host runs, compile, repack
    reference.py  reference, the numpy twin of the kernels
engine/formats/repack.py has the layouts and the arithmetic.
"""
from engine.kernels.gemm.build import (
    FILE_LAYOUT_BITS,
    LANES,
    ONE_ROW_PREFETCH,
    TILES,
    build_gemm_ir,
    supported,
)

__all__ = ["FILE_LAYOUT_BITS", "LANES", "ONE_ROW_PREFETCH", "TILES", "build_gemm_ir", "supported"]
