"""The interleaved legacy-type kernels (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1) with their prefill
products on AMX-INT8 tiles (Sapphire Rapids' `tdpbsud`: a 16 x 16 int32 tile += 16 x 64 signed
bytes times 64 x 16 unsigned bytes, 8 times `vpdpbusd`'s multiply-adds per cycle).

    gemm_<type>(w, xq, out, nb, r0, r1, M, N)     the VNNI module's signature (engine.kernels.gemm)

M < 16: the VNNI nest (gemm.build). M >= 16: its first 16 floor(M / 16) rows on AMX, the rest
on the VNNI nest. Both give the same bits: a block's integer sum is exact either way, and its
float epilogue here is the VNNI body's, operation for operation, in the same block order
(legacy.py: acc = fma(d[r] * dx[b], float(isum), acc), then fma(m[r], s[b], acc) for Q4_1 and
Q5_1). So the numpy twin is gemm.reference, and the bits the VNNI kernel is tested for hold.

A block has 32 values, and every block its own scales, so each tile product covers one block
(K = 32: A is 16 activation rows x 32 bytes, B 8 rows x 64 bytes) and its int32 tile is stored
and scaled in AVX-512 before the next block adds in. The repacked layout's chunks are already
B's: chunk c holds 4 consecutive values of each of the 16 weight rows, one row per 4 bytes, so
a block unpacks to 8 x 64 bytes (the VNNI body's unpacked registers), once per call for the
whole of a group's K slice; then every 16-row tile of activations (`tileloadd` straight from the
r8_0 / r8_1 rows) runs over the slice:

    for each group of 16 weight rows in [r0, r1):
      for each K slice of up to KB blocks:
        unpack the slice's blocks into B panels (stack)
        for each 16 activation rows m0:
          copy dx (and s, or the integer offset c) of the 16 rows' blocks (stack tables)
          acc[0..15] = slice 0 ? 0 : out[m0 + t, group]          (the sum continues: same bits)
          for blocks in fours (then one by one):
            per block u: A = xq[m0.., block], B = panel; C_u = 0; C_u += A B   (tiles 4 + u)
            per block u: store C_u; per row t: isum = C_u[t] (+ c); acc[t] = the epilogue
          out[m0 + t, group] = acc[t]

Four C tiles in flight let the tile unit compute the next blocks while the vector units scale
the last ones (tiles are not renamed: one C tile would wait for its store every block).
Tiles: 0, 1 A (16 x 32 bytes), 2, 3 B (8 x 64), 4..7 C (16 x 64).
"""
from __future__ import annotations

from collections.abc import Callable

from engine.formats.quant_iq import CODEBOOK
from engine.formats.repack import ACTIVATION, GROUP_BLOCK_BYTES, ROWS, T
from engine.kernels import amx_state
from engine.kernels.gemm import build, legacy
from engine.kernels.gemm.quantizer import Act, build_quantize
from engine.kernels.ir.consts import V16F, V16I, i32x16
from engine.kernels.ir.intdot import Dots
from engine.kernels.ir.intrinsics import declarations
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.jit import NO_MACHINE_SCHEDULER

KB = 64         # blocks per K slice: a group's B panels 32 KB, 16 activation rows' slice 32 KB
MIN_ROWS = 16   # activation rows from which a call takes the tiles
PANEL = 512     # bytes of one block's B panel (8 chunks x 64)
_U = 4          # blocks in flight (C tiles 4 .. 7)
_PITCH = 4 * KB  # bytes per row of the dx / s tables
_LANES = "<16 x i64> <" + ", ".join(f"i64 {j}" for j in range(16)) + ">"


def _splat_i64(f: KernelFn, v: str) -> str:
    s = f.let(f"insertelement <16 x i64> poison, i64 {v}, i64 0")
    return f.let(f"shufflevector <16 x i64> {s}, <16 x i64> poison, <16 x i32> zeroinitializer")


def _chunks_q8_0(f: KernelFn, dots: Dots, wb: str) -> list[str]:
    return [f.load("<64 x i8>", wb, 64 * k) for k in range(8)]


def _chunks_iq4_nl(f: KernelFn, dots: Dots, wb: str) -> list[str]:
    table = [v + 128 for v in CODEBOOK]
    return [dots.lookup(c, table) for c in legacy.legacy_chunks(f, wb, None)]


def _chunks_4bit(f: KernelFn, dots: Dots, wb: str) -> list[str]:
    return legacy.legacy_chunks(f, wb, None)


def _chunks_5bit(f: KernelFn, dots: Dots, wb: str) -> list[str]:
    return legacy.legacy_chunks(f, wb, 256)


# per type: its unpacked chunks (unsigned), the shift of r8_0's c giving the integer offset the
# VNNI body starts its sum at (None: no offset; r8_1's s goes into the min term instead), and
# where the block's 16 d (and m) halves sit
_SPEC: dict[T, tuple[Callable[[KernelFn, Dots, str], list[str]], int | None, int, int | None]] = {
    T.Q8_0: (_chunks_q8_0, 0, 512, None),
    T.IQ4_NL: (_chunks_iq4_nl, 0, 256, None),
    T.Q4_0: (_chunks_4bit, 4, 256, None),
    T.Q5_0: (_chunks_5bit, 3, 320, None),
    T.Q4_1: (_chunks_4bit, None, 256, 288),
    T.Q5_1: (_chunks_5bit, None, 320, 352),
}
TYPES = frozenset(_SPEC)

_DECLS = amx_state.TILE_DECLARATIONS + """declare void @llvm.x86.tdpbsud(i8 immarg, i8 immarg, i8 immarg)
declare <16 x i32> @llvm.masked.load.v16i32.p0(ptr, i32 immarg, <16 x i1>, <16 x i32>)
"""


def tile_config() -> bytes:
    """ldtilecfg's 64 bytes: palette 1; tiles 0, 1 16 x 32 bytes (A), 2, 3 8 x 64 (B), 4..7 16 x 64 (C)."""
    shapes = [(16, 32), (16, 32), (8, 64), (8, 64)] + [(16, 64)] * 4
    cfg = bytearray(64)
    cfg[0] = 1
    for i, (rows, colsb) in enumerate(shapes):
        cfg[16 + 2 * i:18 + 2 * i] = colsb.to_bytes(2, "little")
        cfg[48 + i] = rows
    return bytes(cfg)


def _config_global(name: str) -> str:
    body = "".join(f"\\{b:02X}" for b in tile_config())
    return f'@{name} = private unnamed_addr constant [64 x i8] c"{body}", align 64\n'


_ARGS = "ptr noalias %w, ptr noalias %xq, ptr noalias %out, i64 %nb, i64 %r0, i64 %r1, i64 %M, i64 %N"
_CALL_ARGS = "ptr %w, ptr %xq, ptr %out, i64 %nb, i64 %r0, i64 %r1, i64 %M, i64 %N"


def _build_tiles(qtype: T, fname: str, cfg: str, pipelined: bool) -> str:
    """The AMX nest for M a multiple of 16 (see the module docstring)."""
    chunks_of, shift, d_at, m_at = _SPEC[qtype]
    f = KernelFn(f"void @{fname}({_ARGS}) noinline")
    dots = Dots(f, "vnni512")
    act = Act(f, ACTIVATION[qtype])
    f.do(f"call void @llvm.x86.ldtilecfg(ptr @{cfg})")
    panels = f.let(f"alloca [{KB * PANEL} x i8], align 64")
    cbuf = f.let(f"alloca [{_U * 1024} x i8], align 64")
    dtab = f.let(f"alloca [{16 * _PITCH} x i8], align 64")   # [row][block] dx
    otab = f.let(f"alloca [{16 * _PITCH} x i8], align 64")   # [row][block] s (float) or c (i32)
    group_bytes = f.mul("%nb", GROUP_BLOCK_BYTES[qtype])
    g0 = f.let(f"lshr i64 {f.add('%r0', ROWS - 1)}, 4")
    g1 = f.let(f"lshr i64 {f.add('%r1', ROWS - 1)}, 4")
    n_slices = f.let(f"udiv i64 {f.add('%nb', KB - 1)}, {KB}")
    n_mt = f.let("lshr i64 %M, 4")

    def group(g: str) -> None:
        wg = f.gep("%w", f.mul(g, group_bytes))
        col = f.mul(g, ROWS)

        def k_slice(ks: str) -> None:
            b0 = f.mul(ks, KB)
            left = f.let(f"sub i64 %nb, {b0}")
            nbs = f.select(f.let(f"icmp ult i64 {left}, {KB}"), "i64", left, str(KB))
            first = f.let(f"icmp eq i64 {ks}, 0")

            def unpack(j: str) -> None:
                wb = f.gep(wg, f.mul(f.add(b0, j), GROUP_BLOCK_BYTES[qtype]))
                dst = f.gep(panels, f.mul(j, PANEL))
                for k, c in enumerate(chunks_of(f, dots, wb)):
                    f.store("<64 x i8>", c, dst, 64 * k, 64)

            f.each(nbs, unpack)

            def m_tile(mt: str) -> None:
                m0 = f.mul(mt, 16)
                xrow = act.row(m0)   # row m0 of the activations; row m0 + t is t strides on

                # the 16 rows' dx and s (or c) of the slice's blocks, copied to tables of a
                # fixed row pitch, so the epilogue's broadcasts are one base plus constants
                for t in range(16):
                    src = f.gep(xrow, f.mul(str(t), act.stride)) if t else xrow
                    for tab, at in ((dtab, act.d_at), (otab, act.c_at)):
                        first_b = f.gep(src, f.add(at, f.mul(b0, 4)))
                        for c in range(KB // 16):
                            def copy(c: int = c, tab: str = tab, first_b: str = first_b, t: int = t) -> None:
                                mask = f.let(f"icmp slt {_LANES}, {_splat_i64(f, f.let(f'sub i64 {nbs}, {16 * c}'))}")
                                v = f.let(f"call {V16I} @llvm.masked.load.v16i32.p0(ptr "
                                          f"{f.gep(first_b, 64 * c)}, i32 4, <16 x i1> {mask}, "
                                          f"{V16I} zeroinitializer)")
                                f.store(V16I, v, tab, _PITCH * t + 64 * c, 64)
                            f.if_then(f.let(f"icmp ugt i64 {nbs}, {16 * c}"), copy)

                outs = [f.gep("%out", f.mul(f.add(f.mul(f.add(m0, t), "%N"), col), 4)) for t in range(16)]

                def init(t: int) -> str:
                    return f.if_value(f.let(f"xor i1 {first}, true"), V16F,
                                      lambda: f.load(V16F, outs[t], 0, 4), "zeroinitializer")

                accs0 = [init(t) for t in range(16)]
                a_base = f.gep(xrow, f.mul(b0, 32))

                def issue(j: str, u: int) -> None:
                    a, bt, c = u % 2, 2 + u % 2, 4 + u
                    f.do(f"call void @llvm.x86.tileloadd64(i8 {a}, ptr {f.gep(a_base, f.mul(j, 32))}, "
                         f"i64 {act.stride})")
                    f.do(f"call void @llvm.x86.tileloadd64(i8 {bt}, ptr {f.gep(panels, f.mul(j, PANEL))}, i64 64)")
                    f.do(f"call void @llvm.x86.tilezero(i8 {c})")
                    f.do(f"call void @llvm.x86.tdpbsud(i8 {c}, i8 {a}, i8 {bt})")

                def epilogue(j: str, u: int, accs: list[str]) -> list[str]:
                    buf = f.gep(cbuf, 1024 * u)
                    f.do(f"call void @llvm.x86.tilestored64(i8 {4 + u}, ptr {buf}, i64 64)")
                    wb = f.gep(wg, f.mul(f.add(b0, j), GROUP_BLOCK_BYTES[qtype]))
                    dw = f.half16(wb, d_at)
                    mw = f.half16(wb, m_at) if m_at is not None else None
                    drow, orow = f.gep(dtab, f.mul(j, 4)), f.gep(otab, f.mul(j, 4))
                    out = []
                    for t, acc in enumerate(accs):
                        isum = f.load(V16I, buf, 64 * t, 64)
                        if shift is not None:   # the VNNI body's starting value, c >> shift
                            c = f.bcast(orow, _PITCH * t)
                            if shift:
                                c = f.let(f"ashr {V16I} {c}, {i32x16(shift)}")
                            isum = f.let(f"add {V16I} {c}, {isum}")
                        dx = f.splat_float(f.load("float", drow, _PITCH * t, 4), 16)
                        acc = f.fma(16, f.let(f"fmul {V16F} {dw}, {dx}"), f.tofloat(isum), acc)
                        if mw is not None:
                            sx = f.splat_float(f.load("float", orow, _PITCH * t, 4), 16)
                            acc = f.fma(16, mw, sx, acc)
                        out.append(acc)
                    return out

                n_quads = f.let(f"udiv i64 {nbs}, {_U}")

                def quad(q: str, accs: list[str]) -> list[str]:
                    js = [f.add(f.mul(q, _U), u) for u in range(_U)]
                    if not pipelined:
                        for u, j in enumerate(js):
                            issue(j, u)
                        for u, j in enumerate(js):
                            accs = epilogue(j, u, accs)
                        return accs
                    # blocks 0, 1 of this quad were issued before (the prologue or the last
                    # quad): issue 2, 3, scale 0, 1, issue the next quad's 0, 1, scale 2, 3
                    issue(js[2], 2)
                    issue(js[3], 3)
                    accs = epilogue(js[0], 0, accs)
                    accs = epilogue(js[1], 1, accs)

                    def next_pair() -> None:
                        issue(f.add(js[0], _U), 0)
                        issue(f.add(js[1], _U), 1)

                    f.if_then(f.let(f"icmp ult i64 {f.add(q, 1)}, {n_quads}"), next_pair)
                    accs = epilogue(js[2], 2, accs)
                    return epilogue(js[3], 3, accs)

                if pipelined:
                    def prologue() -> None:
                        issue("0", 0)
                        issue("1", 1)

                    f.if_then(f.let(f"icmp ne i64 {n_quads}, 0"), prologue)
                accs = f.loop(n_quads, [(V16F, a) for a in accs0], quad)
                done = f.mul(n_quads, _U)

                def single(i: str, accs: list[str]) -> list[str]:
                    j = f.add(done, i)
                    issue(j, 0)
                    return epilogue(j, 0, accs)

                accs = f.loop(f.let(f"sub i64 {nbs}, {done}"), [(V16F, a) for a in accs], single)
                for t in range(16):
                    f.store(V16F, accs[t], outs[t], 0, 4)

            f.each(n_mt, m_tile)

        f.each(n_slices, k_slice)

    f.loop_range(g0, g1, group)
    f.do("call void @llvm.x86.tilerelease()")
    f.do("ret void")
    return f.text()


def _build_dispatch(qtype: T, fname: str, tiles: str, vnni: str) -> str:
    """M < MIN_ROWS: the VNNI nest; else the tiles for 16 floor(M / 16) rows, the VNNI nest
    for the rest (its rows start MT rows on in xq and out)."""
    f = KernelFn(f"void @{fname}({_ARGS})")
    act = Act(f, ACTIVATION[qtype])
    small = f.let(f"icmp ult i64 %M, {MIN_ROWS}")
    f.do(f"br i1 {small}, label %vnni, label %amx")
    f.label("vnni")
    f.do(f"call void @{vnni}({_CALL_ARGS})")
    f.do("ret void")
    f.label("amx")
    mt = f.let("and i64 %M, -16")
    f.do(f"call void @{tiles}({_CALL_ARGS.replace('i64 %M', f'i64 {mt}')})")
    rest = f.let(f"sub i64 %M, {mt}")

    def tail() -> None:
        xq = f.gep("%xq", f.mul(mt, act.stride))
        out = f.gep("%out", f.mul(f.mul(mt, "%N"), 4))
        f.do(f"call void @{vnni}(ptr %w, ptr {xq}, ptr {out}, i64 %nb, i64 %r0, i64 %r1, "
             f"i64 {rest}, i64 %N)")

    f.if_then(f.let(f"icmp ne i64 {rest}, 0"), tail)
    f.do("ret void")
    return f.text()


def build_amx_gemm_ir(qtype: T, tile: int | None = None, pipelined: bool = True) -> str:
    """The module for one legacy weight type: the VNNI module's quantizer and nests, the AMX
    nest, and gemm_<type> choosing by M."""
    if qtype not in _SPEC:
        raise ValueError(f"no AMX kernel for {qtype.name}")
    tile = build.TILES[qtype] if tile is None else tile
    name = f"gemm_{qtype.name.lower()}"
    cfg = f"{name}_tilecfg"
    head = (NO_MACHINE_SCHEDULER + declarations(*build.INTRINSICS) + _DECLS + _config_global(cfg)
            + build_quantize(ACTIVATION[qtype]))
    vnni = (build._build_gemm(qtype, "vnni512", 1, f"{name}_one", noinline=True)
            + build._build_gemm(qtype, "vnni512", tile, f"{name}_vnni", one_row=f"{name}_one",
                                noinline=True))
    return (head + vnni + _build_tiles(qtype, f"{name}_amx", cfg, pipelined)
            + _build_dispatch(qtype, name, f"{name}_amx", f"{name}_vnni"))
