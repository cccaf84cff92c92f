"""The activation quantizers of the row-interleaved kernels: float32 rows -> engine.formats.repack's
r8_0 / r8_1 / r8_k rows (quantize_rows is their numpy twin), as ggml quantizes q8_0 / q8_1 /
q8_k blocks."""
from __future__ import annotations

from engine.formats.repack import ACT_BLOCK
from engine.kernels.ir import q8
from engine.kernels.ir.consts import shuffle_mask
from engine.kernels.ir.vectors import KernelFn


class Act:
    """Addresses in an activation row (engine.formats.repack: qs | d | c (r8_0) or c16 | b32 (r8_k))."""

    def __init__(self, f: KernelFn, act: str) -> None:
        self.f, self.act = f, act
        elems = ACT_BLOCK[act]
        self.k = f.mul("%nb", elems)
        raw = f.mul("%nb", elems + (84 if act == "r8_k" else 8))
        self.stride = f.let(f"and i64 {f.add(raw, 63)}, -64")
        self.d_at = self.k
        self.c_at = f.add(self.k, f.mul("%nb", 4))       # r8_0: c; r8_1: s; r8_k: c16
        self.b32_at = f.add(self.k, f.mul("%nb", 68))    # r8_k only

    def row(self, m: str) -> str:
        return self.f.gep("%xq", self.f.mul(m, self.stride))


def build_quantize(act: str) -> str:
    """quantize_<act>(x, xq, nb, r0, r1, M): as ggml's q8_0 / q8_k (d = max|x| / 127,
    q = roundeven(x * (127 / max|x|)), 0 for an all-zero block), laid out as engine.formats.repack says."""
    elems = ACT_BLOCK[act]
    f = KernelFn(f"void @quantize_{act}(ptr noalias %x, ptr noalias %xq, i64 %nb, i64 %r0, i64 %r1, i64 %M)")
    a = Act(f, act)

    def per_block(m: str, j: str) -> None:
        src = f.gep("%x", f.mul(f.add(f.mul(m, "%nb"), j), 4 * elems))
        row = a.row(m)
        amax = q8.absmax(f, src, elems // 32, 4)
        d = f.let(f"fdiv float {amax}, 127.0")
        nonzero = f.let(f"fcmp one float {amax}, 0.0")
        inv = f.let(f"select i1 {nonzero}, float {f.let(f'fdiv float 127.0, {amax}')}, float 0.0")
        qs = f.gep(row, f.mul(j, elems))
        if act == "r8_1":  # d and s = d * sum(q), each rounded to f16 (kept as is beyond it)
            q = q8.quantize_chunk(f, src, qs, inv, 4)
            total = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            sv = f.let(f"fmul float {d}, {f.let(f'sitofp i32 {total} to float')}")
            f.store("float", q8.round_to_half(f, d), row, f.add(a.d_at, f.mul(j, 4)), 4)
            f.store("float", q8.round_to_half(f, sv), row, f.add(a.c_at, f.mul(j, 4)), 4)
            return
        if act == "r8_0":
            q = q8.quantize_chunk(f, src, qs, inv, 4)
            dh = f.let(f"fpext half {f.let(f'fptrunc float {d} to half')} to float")
            f.store("float", dh, row, f.add(a.d_at, f.mul(j, 4)), 4)
            total = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            f.store("i32", f.let(f"mul i32 {total}, -128"), row, f.add(a.c_at, f.mul(j, 4)), 4)
            return
        f.store("float", d, row, f.add(a.d_at, f.mul(j, 4)), 4)
        c16 = f.gep(row, f.add(a.c_at, f.mul(j, 64)))
        b32 = f.gep(row, f.add(a.b32_at, f.mul(j, 16)))
        for c in range(elems // 32):
            q = q8.quantize_chunk(f, f.gep(src, 128 * c), f.gep(qs, 32 * c), inv, 4)
            sums = []
            for h in range(2):
                part = f.let(f"shufflevector <32 x i32> {q}, <32 x i32> poison, "
                             f"{shuffle_mask(range(16 * h, 16 * h + 16))}")
                sums.append(f.let(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {part})"))
                f.store("i32", f.let(f"mul i32 {sums[-1]}, -32"), c16, 4 * (2 * c + h), 4)
            pair = f.let(f"add i32 {sums[0]}, {sums[1]}")
            f.store("i16", f.let(f"trunc i32 {pair} to i16"), b32, 2 * c, 2)

    def row(m: str) -> None:
        def block(j: str, _: list[str]) -> list[str]:
            per_block(m, j)
            return []

        f.loop("%nb", [], block)

    f.loop_range("%r0", "%r1", row)
    f.do("ret void")
    return f.text()
