"""build_gemm_ir: one weight type's interleaved module, the loop nest over its body (legacy.py,
kquants.py) for one ISA entry (engine.kernels.ir.intdot's Dots: vnni512, avx2, portable); the
package docstring has the functions and the loop nest."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from engine.formats.repack import ACTIVATION, GROUP_BLOCK_BYTES, ROWS, T
from engine.kernels.gemm import kquants, legacy
from engine.kernels.gemm.quantizer import Act, build_quantize
from engine.kernels.ir.consts import V16F
from engine.kernels.ir.intdot import Dots
from engine.kernels.ir.intrinsics import declarations
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.jit import NO_MACHINE_SCHEDULER

# activation rows per tile: a tile row keeps LANES[type] accumulators of 16 rows
TILES = dict.fromkeys([T.Q8_0, T.Q4_0, T.Q5_0, T.IQ4_NL, T.Q4_1, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
                       T.Q6_K, T.IQ4_XS], 4)
# The K-quants fold each step's sub-block chains into the isum as they complete, so a tile row
# holds 2 dot chains, and the module compiles without LLVM's machine scheduler (jit's
# NO_MACHINE_SCHEDULER), which hoisted a block's unpacked quants into stack slots: 4-row tiles
# ran at 0.6-0.85x of 1 row with it. Without it, one thread, 1.1B shapes, M = 8 and 512: tiles as
# before (Q4_K 2, Q5_K/Q6_K 3) 0.96-1.05x, Q5_K 1.26-1.30x (a scratch A/B of the two builds);
# 4 rows / those Q4_K 1.13-1.20x and 0.99-1.06x, Q6_K 1.06-1.12x and 1.06-1.12x, Q5_K
# 1.05-1.09x and 1.06-1.10x; 6 rows / 4 0.59-0.96x for Q4_K, Q8_0 and Q5_0
# (scripts/bench_matmul.py --ab-tiles A,B --types T --shapes 1b --ms 8,512).
# A call's rows: whole tiles, then one smaller tile for what is left, then single rows.
# (no software prefetch for single rows: 1-8 blocks ahead, to L1 or L2, measured 10-35% slower
# from DRAM; for the K-quants read in memory order, 32 blocks ahead was slower (Q4_K M = 1:
# 27.5 -> 19.3 GB/s). Tiles prefetch the next group: see _build_gemm.)

# Single rows of these types prefetch this many bytes ahead into L2, a block's lines per block:
# the low-bit K-quants spend so many instructions per byte that the out-of-order window covers
# too little of the stream (one thread, M = 1, 1.1B shapes from DRAM, against no prefetch: Q2_K
# 4 KiB 1.28-1.44x the file layout, 8 KiB 1.68-1.87x, 16 KiB 1.56-1.73x, from 0.69-0.87x; Q3_K
# 8 KiB 1.28-1.59x from 0.64-0.67x; to L1 instead: 0.74-1.12x).
ONE_ROW_PREFETCH = {T.Q2_K: 8192, T.Q3_K: 8192}

# A body folds one block of 16 weight rows into each tile row's accumulators: accs[t] holds
# LANES[type] <16 x float> vectors (see the module docstring), returned updated.
Body = Callable[[KernelFn, Dots, Act, str, str, list[str], Sequence[Sequence[str]]], list[list[str]]]



BODIES: dict[T, Body] = {T.Q8_0: legacy.body_q8_0, T.Q4_0: legacy.body_q4_0, T.Q5_0: legacy.body_q5_0,
                         T.IQ4_NL: legacy.body_iq4_nl, T.Q4_1: legacy.body_q4_1, T.Q5_1: legacy.body_q5_1,
                         T.Q2_K: kquants.body_q2_k, T.Q3_K: kquants.body_q3_k, T.Q4_K: kquants.body_q4_k,
                         T.Q5_K: kquants.body_q5_k, T.Q6_K: kquants.body_q6_k, T.IQ4_XS: kquants.body_iq4_xs}
# accumulators per (16 weight rows, activation row)
LANES = {T.Q8_0: 1, T.Q4_0: 1, T.Q5_0: 1, T.IQ4_NL: 1, T.IQ4_XS: 1, T.Q2_K: 2, T.Q3_K: 1, T.Q4_1: 1,
         T.Q5_1: 1, T.Q4_K: 2, T.Q5_K: 2, T.Q6_K: 1}
# the types whose results are the file-layout kernels' bits (tests/engine/test_gemm.py asserts it)
FILE_LAYOUT_BITS = frozenset({T.Q4_K, T.Q5_K, T.Q6_K})


def supported(qtype: T, isa: str) -> bool:
    """Whether this module has a kernel for qtype on isa (AVX2 maddubs would saturate on the
    u8 weights of Q8_0 and the codebook types, up to 255 and 241)."""
    return qtype in BODIES and not (qtype in (T.Q8_0, T.IQ4_NL, T.IQ4_XS) and isa == "avx2")


def _lane_sum(f: KernelFn, v: list[str]) -> str:
    """A row's accumulators summed: Q4_K/Q5_K's acc + nacc (hsum_halves of matmul.kquants.fold_whole's
    accumulator, whose other lanes are 0)."""
    return v[0] if len(v) == 1 else f.let(f"fadd {V16F} {v[0]}, {v[1]}")


def _prefetch_lines(f: KernelFn, at: str, first: int, stop: int) -> None:
    """Cache lines first..stop-1 from `at` into L2 (a prefetch never faults: past the last
    group it is dropped)."""
    for line in range(first, stop):
        f.do(f"call void @llvm.prefetch.p0(ptr {f.gep(at, 64 * line)}, i32 0, i32 2, i32 1)")


# the intrinsics an interleaved module declares (engine.kernels.ir.intrinsics), in its order
INTRINSICS = (
    "llvm.prefetch.p0", "llvm.x86.avx512.vpdpbusd.512", "llvm.x86.avx512.vpdpwssd.512",
    "llvm.x86.avx512.pshuf.b.512", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd",
    "llvm.fma.v16f32", "llvm.fabs.v32f32", "llvm.roundeven.v32f32", "llvm.vector.reduce.fmax.v32f32",
    "llvm.maxnum.f32", "llvm.fabs.f32", "llvm.vector.reduce.add.v16i32", "llvm.vector.reduce.add.v32i32",
)
_ARGS = "ptr noalias %w, ptr noalias %xq, ptr noalias %out, i64 %nb, i64 %r0, i64 %r1, i64 %M, i64 %N"


def _build_gemm(qtype: T, isa: str, tile: int, fname: str, one_row: str | None = None,
                noinline: bool = False) -> str:
    """The loop nest as function `fname`; with `one_row`, calls of one row go to that
    function (the same nest for single rows, compiled alone and kept out of line: inside the
    tiled function the single-row loop ran 3-8% slower at M = 1, its registers allotted around
    the tile's)."""
    f = KernelFn(f"void @{fname}({_ARGS})" + (" noinline" if noinline else ""))
    if one_row is not None:
        small = f.let("icmp ult i64 %M, 2")
        f.do(f"br i1 {small}, label %one_row, label %tiled")
        f.label("one_row")
        f.do(f"call void @{one_row}({_ARGS.replace('noalias ', '')})")
        f.do("ret void")
        f.label("tiled")
    dots = Dots(f, isa)
    act = Act(f, ACTIVATION[qtype])
    body, lanes = BODIES[qtype], LANES[qtype]
    g0 = f.let(f"lshr i64 {f.add('%r0', ROWS - 1)}, 4")
    g1 = f.let(f"lshr i64 {f.add('%r1', ROWS - 1)}, 4")
    group_bytes = f.mul("%nb", GROUP_BLOCK_BYTES[qtype])
    n_tiles = f.let(f"udiv i64 %M, {tile}")
    rest0 = f.mul(n_tiles, tile)
    def group(g: str) -> None:
        wg = f.gep("%w", f.mul(g, group_bytes))
        col = f.mul(g, ROWS)

        def tile_rows(m0: str, rows: int) -> None:
            xs = [act.row(f.add(m0, t)) for t in range(rows)]
            # the next group into L2, block by block, during the call's second tile, which
            # computes from cache: else the next group's first tile waits on memory. With just
            # two tiles the first takes half of it (one tile's compute is too short to cover
            # fetching a group). One thread, 1.1B shapes: Q4_K 1.10-1.21x (M = 4 and 8), Q6_K
            # 1.06-1.12x (M = 4); the split, at M = 8: Q6_K 1.17-1.28x, Q8_0 1.45x more
            lo: str | None = None
            hi: str | None = None
            if rows == tile > 1:
                hi = f.let(f"icmp eq i64 {m0}, {tile}")
                lo = f.select(f.let(f"icmp eq i64 {n_tiles}, 2"), "i1", f.let(f"icmp eq i64 {m0}, 0"), hi)
            n_lines = (GROUP_BLOCK_BYTES[qtype] + 63) // 64

            def block(b: str, flat: list[str]) -> list[str]:
                wb = f.gep(wg, f.mul(b, GROUP_BLOCK_BYTES[qtype]))
                if tile == 1 and qtype in ONE_ROW_PREFETCH:
                    _prefetch_lines(f, f.gep(wb, ONE_ROW_PREFETCH[qtype]), 0, n_lines)
                if lo is not None and hi is not None:
                    nxt = f.gep(wb, group_bytes)
                    f.if_then(lo, functools.partial(_prefetch_lines, f, nxt, 0, n_lines // 2))
                    f.if_then(hi, functools.partial(_prefetch_lines, f, nxt, n_lines // 2, n_lines))
                accs = [flat[lanes * t:lanes * (t + 1)] for t in range(rows)]
                return [v for row in body(f, dots, act, wb, b, xs, accs) for v in row]

            flat = f.loop("%nb", [(V16F, "zeroinitializer")] * (rows * lanes), block)
            for t in range(rows):
                acc = _lane_sum(f, flat[lanes * t:lanes * (t + 1)])
                at = f.add(f.mul(f.add(m0, t), "%N"), col)
                f.store(V16F, acc, f.gep("%out", f.mul(at, 4)), 0, 4)

        def full_tile(i: str, _: list[str]) -> list[str]:
            tile_rows(f.mul(i, tile), tile)
            return []

        f.loop(n_tiles, [], full_tile)

        def smaller_tile(at: str, size: int) -> str:
            tile_rows(at, size)
            return f.add(at, size)

        rest = rest0
        for size in range(tile - 1, 1, -1):  # the rows left: one smaller tile, then singles
            left = f.let(f"sub i64 %M, {rest}")
            rest = f.if_value(f.let(f"icmp uge i64 {left}, {size}"), "i64",
                              functools.partial(smaller_tile, rest, size), rest)
        f.loop_range(rest, "%M", lambda m: tile_rows(m, 1))

    f.loop_range(g0, g1, group)
    f.do("ret void")
    return f.text()


def build_gemm_ir(qtype: T, isa: str, tile: int | None = None) -> str:
    """The module for one weight type: its activation quantizer and its gemm function."""
    tile = TILES[qtype] if tile is None else tile
    if not supported(qtype, isa):
        raise ValueError(f"no interleaved kernel for {qtype.name} on {isa}")
    name = f"gemm_{qtype.name.lower()}"
    head = NO_MACHINE_SCHEDULER + declarations(*INTRINSICS) + build_quantize(ACTIVATION[qtype])
    if tile == 1:
        return head + _build_gemm(qtype, isa, 1, name)
    return (head + _build_gemm(qtype, isa, 1, f"{name}_one", noinline=True)
            + _build_gemm(qtype, isa, tile, name, one_row=f"{name}_one"))
