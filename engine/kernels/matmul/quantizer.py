"""The activation quantizer: quantize_<act>, f32 rows -> the packed 8-bit blocks the tiles read
(q8_0, q8_1 or q8_k; engine/formats/activations.py has the layouts and the numpy twin), and Packed, the
byte addresses of the packed q8_0 / q8_1 layout (rows in pairs, scales of 8 rows side by side).
"""
from __future__ import annotations

from engine.formats.activations import ACTIVATION_BLOCK, ACTIVATION_LAYOUTS
from engine.kernels.ir import q8
from engine.kernels.ir.consts import shuffle_mask
from engine.kernels.ir.vectors import KernelFn


class Packed:
    """Byte addresses in packed q8_0 / q8_1 activations (engine.formats.quants.pack_activations):

        qs      [ceil(M / 2), nb, 2, 32] i8     rows in pairs
        scales  [ceil(M / 8), nb, k, 8] f32     k = 1 (d) for q8_0, 2 (d, s) for q8_1

    Strides along the blocks are constants (64 and 32 * k bytes), so a loop over blocks walks
    all of them with one index.
    """

    def __init__(self, f: KernelFn, act: str) -> None:
        self.f = f
        self.k = 2 if act == "q8_1" else 1
        pairs = f.let(f"lshr i64 {f.add('%M', 1)}, 1")
        self.scales = f.gep("%xq", f.mul(f.mul(pairs, "%nb"), 64))

    def qs(self, row: str, b: str) -> str:
        """Address of row's block b (a 64-byte load from an even row takes the pair's)."""
        f = self.f
        pair = f.let(f"lshr i64 {row}, 1")
        odd = f.mul(f.let(f"and i64 {row}, 1"), 32)
        return f.gep("%xq", f.add(f.mul(f.add(f.mul(pair, "%nb"), b), 64), odd))

    def scale(self, row: str, b: str, which: int) -> str:
        """Address of d (which = 0) or s (which = 1) of row's block b; the next rows of row's
        group of 8 follow it."""
        f = self.f
        group = f.let(f"lshr i64 {row}, 3")
        lane = f.mul(f.let(f"and i64 {row}, 7"), 4)
        at = f.add(f.mul(f.add(f.mul(group, "%nb"), b), 32 * self.k), lane)
        return f.gep(self.scales, at if which == 0 else f.add(at, 32))



# --- activation quantizer ---------------------------------------------------------------------

def build_quantize_ir(act: str) -> str:
    """quantize_<act>(ptr x, ptr xq, i64 nb, i64 r0, i64 r1, i64 M): rows [r0, r1) of x, f32
    [M, nb * block], into the packed activations of all M rows (engine.formats.quants.pack_activations:
    q8_0/q8_1 keep a block's i8 values of rows in pairs and its scales of 8 rows side by side,
    see Packed; q8_k keeps ggml's blocks row by row), so threads can quantize disjoint row ranges.

    Per block, as ggml quantizes: d = max|x| / 127, q = roundeven(x * (127 / max|x|)) (0 when
    max|x| == 0); no fast-math, so the numpy twin (engine.formats.quants.quantize_activations, then
    pack_activations) gives the same bytes. q8_0 and q8_1 carry d (and q8_1's s = d * sum(q))
    rounded to f16 like ggml's blocks (q8_0 as f16 itself, overflowing like ggml, q8_1 keeping a
    value beyond f16's range), stored in f32 slots so the kernel needs no conversion.
    """
    elems = ACTIVATION_BLOCK[act]
    f = KernelFn(f"void @quantize_{act}(ptr noalias %x, ptr noalias %xq, i64 %nb, i64 %r0, i64 %r1, i64 %M)")
    packed = Packed(f, act) if act != "q8_k" else None

    def per_block(m: str, j: str) -> None:  # block j of row m
        b = f.add(f.mul(m, "%nb"), j)
        src = f.gep("%x", f.mul(b, 4 * elems))
        amax = q8.absmax(f, src, elems // 32)
        d = f.let(f"fdiv float {amax}, 127.0")
        nonzero = f.let(f"fcmp one float {amax}, 0.0")
        inv = f.let(f"select i1 {nonzero}, float {f.let(f'fdiv float 127.0, {amax}')}, float 0.0")
        if act == "q8_k":
            dst = f.gep("%xq", f.mul(b, ACTIVATION_LAYOUTS[act].itemsize))
            f.store("float", d, dst, 0)
            for c in range(elems // 32):
                q = q8.quantize_chunk(f, f.gep(src, 128 * c), f.gep(dst, 4 + 32 * c), inv)
                for half in range(2):
                    part = f.let(f"shufflevector <32 x i32> {q}, <32 x i32> poison, "
                                 f"{shuffle_mask(range(16 * half, 16 * half + 16))}")
                    s = f.let(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {part})")
                    f.store("i16", f.let(f"trunc i32 {s} to i16"), dst, 260 + 2 * (2 * c + half))
            return
        assert packed is not None
        q = q8.quantize_chunk(f, src, packed.qs(m, j), inv)
        if act == "q8_1":
            f.store("float", q8.round_to_half(f, d), packed.scale(m, j, 0), 0, 4)
            qsum = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            s = f.let(f"fmul float {d}, {f.let(f'sitofp i32 {qsum} to float')}")
            f.store("float", q8.round_to_half(f, s), packed.scale(m, j, 1), 0, 4)
        else:
            dh = f.let(f"fptrunc float {d} to half")
            f.store("float", f.let(f"fpext half {dh} to float"), packed.scale(m, j, 0), 0, 4)

    f.loop_range("%r0", "%r1", lambda m: f.each("%nb", lambda j: per_block(m, j)))
    f.do("ret void")
    return f.text()

