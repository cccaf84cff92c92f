"""The float weight types' kernels (F32, F16, BF16): f32 activations and FMA.

rows_<type>(ptr w, ptr x, ptr out, i64 K, i64 r0, i64 r1, i64 M, i64 N): the shared loop nest
over chunks of 16 values (two <8 x float> FMA accumulators per activation row), then a scalar
tail for K % 16.
"""
from __future__ import annotations

from engine.formats.quants import QuantType, T
from engine.kernels.ir.consts import V8F, splat_const
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.matmul.loops import emit_rows, row_tiles


def float_widen(f: KernelFn, qtype: T, base: str, offset: str | int, n: int) -> str:
    """Load n weights of a float type as <n x float> (n = 1: a scalar float)."""
    def vt(elem: str) -> str:
        return elem if n == 1 else f"<{n} x {elem}>"

    if qtype == T.F32:
        return f.load(vt("float"), base, offset)
    if qtype == T.F16:
        return f.let(f"fpext {vt('half')} {f.load(vt('half'), base, offset)} to {vt('float')}")
    # BF16 is the top half of an f32
    bits = f.let(f"zext {vt('i16')} {f.load(vt('i16'), base, offset)} to {vt('i32')}")
    shifted = f.let(f"shl {vt('i32')} {bits}, {16 if n == 1 else splat_const('i32', n, 16)}")
    return f.let(f"bitcast {vt('i32')} {shifted} to {vt('float')}")


def build_float_rows(t: QuantType, tiles: tuple[int, ...]) -> str:
    qtype = t.qtype
    name = qtype.name.lower()
    esize = t.block_bytes
    f = KernelFn(f"void @rows_{name}(ptr noalias %w, ptr noalias %x, ptr noalias %out, i64 %K, "
                 f"i64 %r0, i64 %r1, i64 %M, i64 %N)")
    n16 = f.let("udiv i64 %K, 16")
    tail0 = f.mul(n16, 16)
    n_tail = f.let(f"sub i64 %K, {tail0}")

    def block(wbs: list[str], xss: list[list[str]], row_accs: list[list[str]]) -> list[list[str]]:
        wv = [float_widen(f, qtype, wbs[0], 8 * esize * h, 8) for h in range(2)]
        return [[f.let(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {wv[h]}, "
                       f"<8 x float> {f.load(V8F, xs[0], 32 * h)}, <8 x float> {acc[h]})")
                 for h in range(2)]
                for xs, acc in zip(xss, row_accs)]

    def finish(row_accs: list[str], w_row: str, x_row: str) -> str:
        s = f.hsum8(f.let(f"fadd <8 x float> {row_accs[0]}, {row_accs[1]}"))

        def tail(i: str, carried: list[str]) -> list[str]:
            k = f.add(tail0, i)
            wv = float_widen(f, qtype, w_row, f.mul(k, esize), 1)
            xv = f.load("float", x_row, f.mul(k, 4))
            return [f.let(f"call float @llvm.fma.f32(float {wv}, float {xv}, float {carried[0]})")]

        return f.loop(n_tail, [("float", s)], tail)[0]

    accs, tile_block, tile_finish = row_tiles(f, x_base="%x", x_row_bytes=f.mul("%K", 4),
                                              x_block_bytes=64, acc_types=(V8F, V8F),
                                              block=block, finish=finish)
    emit_rows(f, n_blocks=n16, w_block_bytes=16 * esize, w_row_bytes=f.mul("%K", esize),
              group=1, accs=accs, block=tile_block, finish=tile_finish, prefetch=False,
              tiles=tiles)
    f.do("ret void")
    return f.text()

