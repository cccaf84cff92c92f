"""The activation quantizers of the row-interleaved kernels: float32 rows -> engine.formats.repack's
r8_0 / r8_1 / r8_k rows (quantize_rows is their numpy twin), as ggml quantizes q8_0 / q8_1 /
q8_k blocks."""
from __future__ import annotations

from engine.formats.repack import ACT_BLOCK
from engine.kernels.gemm_ir import Act, Fn, mask


def _absmax(f: Fn, src: str, n_chunks: int) -> str:
    amax = None
    for c in range(n_chunks):
        v = f.load("<32 x float>", src, 128 * c, 4)
        m = f.let(f"call float @llvm.vector.reduce.fmax.v32f32(<32 x float> "
                  f"{f.let(f'call <32 x float> @llvm.fabs.v32f32(<32 x float> {v})')})")
        amax = m if amax is None else f.let(f"call float @llvm.maxnum.f32(float {amax}, float {m})")
    assert amax is not None
    return amax


def _quantize_chunk(f: Fn, src: str, dst: str, inv: str) -> str:
    """32 floats * inv, rounded half-even, stored as i8; returns them as <32 x i32>."""
    v = f.load("<32 x float>", src, 0, 4)
    r = f.let(f"call <32 x float> @llvm.roundeven.v32f32(<32 x float> "
              f"{f.let(f'fmul <32 x float> {v}, {f.splat_float(inv, 32)}')})")
    q = f.let(f"fptosi <32 x float> {r} to <32 x i32>")
    f.store("<32 x i8>", f.let(f"trunc <32 x i32> {q} to <32 x i8>"), dst)
    return q


def _round_half(f: Fn, v: str) -> str:
    """v rounded to the nearest f16 value, kept as float; beyond f16's range v itself
    (engine.formats.activations._round_to_half)."""
    r = f.let(f"fpext half {f.let(f'fptrunc float {v} to half')} to float")
    big = f.let(f"fcmp ogt float {f.let(f'call float @llvm.fabs.f32(float {v})')}, 65504.0")
    return f.let(f"select i1 {big}, float {v}, float {r}")


def build_quantize(act: str) -> str:
    """quantize_<act>(x, xq, nb, r0, r1, M): as ggml's q8_0 / q8_k (d = max|x| / 127,
    q = roundeven(x * (127 / max|x|)), 0 for an all-zero block), laid out as engine.formats.repack says."""
    elems = ACT_BLOCK[act]
    f = Fn(f"void @quantize_{act}(ptr noalias %x, ptr noalias %xq, i64 %nb, i64 %r0, i64 %r1, i64 %M)")
    a = Act(f, act)

    def per_block(m: str, j: str) -> None:
        src = f.gep("%x", f.mul(f.add(f.mul(m, "%nb"), j), 4 * elems))
        row = a.row(m)
        amax = _absmax(f, src, elems // 32)
        d = f.let(f"fdiv float {amax}, 127.0")
        nonzero = f.let(f"fcmp one float {amax}, 0.0")
        inv = f.let(f"select i1 {nonzero}, float {f.let(f'fdiv float 127.0, {amax}')}, float 0.0")
        qs = f.gep(row, f.mul(j, elems))
        if act == "r8_1":  # d and s = d * sum(q), each rounded to f16 (kept as is beyond it)
            q = _quantize_chunk(f, src, qs, inv)
            total = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            sv = f.let(f"fmul float {d}, {f.let(f'sitofp i32 {total} to float')}")
            f.store("float", _round_half(f, d), row, f.add(a.d_at, f.mul(j, 4)), 4)
            f.store("float", _round_half(f, sv), row, f.add(a.c_at, f.mul(j, 4)), 4)
            return
        if act == "r8_0":
            q = _quantize_chunk(f, src, qs, inv)
            dh = f.let(f"fpext half {f.let(f'fptrunc float {d} to half')} to float")
            f.store("float", dh, row, f.add(a.d_at, f.mul(j, 4)), 4)
            total = f.let(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {q})")
            f.store("i32", f.let(f"mul i32 {total}, -128"), row, f.add(a.c_at, f.mul(j, 4)), 4)
            return
        f.store("float", d, row, f.add(a.d_at, f.mul(j, 4)), 4)
        c16 = f.gep(row, f.add(a.c_at, f.mul(j, 64)))
        b32 = f.gep(row, f.add(a.b32_at, f.mul(j, 16)))
        for c in range(elems // 32):
            q = _quantize_chunk(f, f.gep(src, 128 * c), f.gep(qs, 32 * c), inv)
            sums = []
            for h in range(2):
                part = f.let(f"shufflevector <32 x i32> {q}, <32 x i32> poison, "
                             f"{mask(list(range(16 * h, 16 * h + 16)))}")
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
