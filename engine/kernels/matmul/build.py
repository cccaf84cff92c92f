"""build_matmul_ir: one weight type's IR module, from its record (engine.formats.quants.TYPES) and the
tile family that record names (FAMILIES).

Quantized types: rows_<type>(ptr w, ptr xq, ptr out, i64 nb, i64 r0, i64 r1, i64 M, i64 N)
with nb = blocks per row, looping as loops.emit_rows shows; per block the family's tiles
(legacy.LegacyTiles, kquants.*_body) unpack the weights once and integer-dot them with each
activation row's block; legacy types fold each block into the row's accumulators in llama.cpp's
order, K-quants sum a block's terms and add them to the row's <8 x float> accumulator. The AVX2
path prefetches PREFETCH_BYTES ahead. The module also holds quantize_<act> (quantizer.py) and
matmul_<type>(w, x, xq, out, nb, M, N), both in one call (the one-thread path).

Float types: rows_<type>(ptr w, ptr x, ptr out, i64 K, ...) (floats.py), no quantizer.
"""
from __future__ import annotations

from collections.abc import Callable

from engine.formats.ggml_types import GGMLQuantizationType
from engine.formats.quants import QuantType, quant_type
from engine.kernels.ir.intdot import IntOps
from engine.kernels.ir.intrinsics import declarations
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.matmul import iquants, kquants, loops
from engine.kernels.matmul.floats import build_float_rows
from engine.kernels.matmul.legacy import LegacyTiles
from engine.kernels.matmul.loops import TILES, RowCallbacks, emit_rows
from engine.kernels.matmul.quantizer import build_quantize_ir

# the intrinsics a row-wise module declares (engine.kernels.ir.intrinsics), in its order
INTRINSICS = (
    "llvm.fma.v8f32", "llvm.fma.v4f32", "llvm.fma.v2f32", "llvm.fma.v1f32", "llvm.fma.f32",
    "llvm.vector.reduce.fadd.v8f32", "llvm.vector.reduce.fmax.v32f32", "llvm.maxnum.f32",
    "llvm.fabs.v32f32", "llvm.fabs.f32", "llvm.roundeven.v32f32", "llvm.vector.reduce.add.v32i32",
    "llvm.vector.reduce.add.v16i32", "llvm.vector.reduce.add.v8i32", "llvm.prefetch.p0",
    "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd", "llvm.x86.avx2.psign.b",
    "llvm.x86.avx2.pshuf.b", "llvm.x86.avx512.vpdpbusd.256", "llvm.x86.avx512.vpdpbusd.512",
    "llvm.x86.avx512.vpdpwssd.256", "llvm.abs.v64i8", "llvm.fma.v16f32",
)


def _legacy_tiles(t: QuantType, f: KernelFn, ops: IntOps, tiles: tuple[int, ...],
                  wide: bool) -> RowCallbacks:
    legacy = LegacyTiles(t, f, ops, max(tiles), wide)
    return RowCallbacks(legacy.accs, legacy.block, legacy.finish, legacy.prologue)


# A tile family: (type record, function being built, integer ops, tile sizes, AVX-512 row pairs)
# -> emit_rows' callbacks. Each record's `kernel` names one of these (or "float").
Family = Callable[[QuantType, KernelFn, IntOps, tuple[int, ...], bool], RowCallbacks]
FAMILIES: dict[str, Family] = {
    "legacy": _legacy_tiles,
    "q2_k": kquants.q2_k_tiles,
    "q3_k": kquants.q3_k_tiles,
    "q4_5_k": kquants.q4_5_k_tiles,
    "q6_k": kquants.q6_k_tiles,
    "iq4_xs": iquants.iq4_xs_tiles,
}


def build_matmul_ir(qtype: GGMLQuantizationType, portable: bool = False, vnni: bool = False,
                    tiles: tuple[int, ...] = TILES, wide: bool = False) -> str:
    """The IR module for one weight type (see the module docstring for its functions)."""
    t = quant_type(qtype)
    act = t.act
    if act is None:
        return declarations(*INTRINSICS) + build_float_rows(t, tiles)
    name = qtype.name.lower()
    block_bytes = t.block_bytes
    # (LLVM splits the 512-bit pair vectors into 256-bit halves here: asking for zmm registers
    # with "prefer-vector-width"="512" measured no faster on the AMD EPYC (Zen 4) host, so the halves stay)
    f = KernelFn(f"void @rows_{name}(ptr noalias %w, ptr noalias %xq, ptr noalias %out, i64 %nb, "
                 f"i64 %r0, i64 %r1, i64 %M, i64 %N)")
    ops = IntOps(f, avx2=not portable, vnni=vnni)
    c = FAMILIES[t.kernel](t, f, ops, tiles, wide)
    emit_rows(f, n_blocks="%nb", w_block_bytes=block_bytes, w_row_bytes=f.mul("%nb", block_bytes),
              group=t.group, accs=c.accs, block=c.block, finish=c.finish, prefetch=not portable,
              tiles=tiles, prologue=c.prologue, row_group=loops.ROW_GROUP.get(t.kernel, 1))
    f.do("ret void")
    fused = (f"define void @matmul_{name}(ptr noalias %w, ptr noalias %x, ptr noalias %xq, "
             f"ptr noalias %out, i64 %nb, i64 %M, i64 %N) {{\n"
             f"entry:\n"
             f"  call void @quantize_{act}(ptr %x, ptr %xq, i64 %nb, i64 0, i64 %M, i64 %M)\n"
             f"  call void @rows_{name}(ptr %w, ptr %xq, ptr %out, i64 %nb, i64 0, i64 %N, "
             f"i64 %M, i64 %N)\n"
             f"  ret void\n}}\n")
    return declarations(*INTRINSICS) + build_quantize_ir(act) + f.text() + fused
