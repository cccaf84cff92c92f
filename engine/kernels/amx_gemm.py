"""A float GEMM on AMX tiles (Sapphire Rapids' TDPBF16PS), near f32 accuracy through bf16 halves:
the vision encoder's big matmuls, where the FMA panel GEMM (engine.kernels.panel_gemm) is
bound by 2 FMA ports.

    out[m, r] = dot(W[r, :], x[m, :])     W [N, K] F16/F32 (packed once)     x float32 [M, K]

Every float is split in two bf16s: hi = its top 16 bits (truncated), lo = bf16(v - hi) rounded to
nearest even. An F16 weight splits exactly (11 significant bits: 8 in hi, 3 in lo); an
activation keeps ~16 bits. The kernel sums three bf16 products per element,

    x_hi w_hi + x_hi w_lo + x_lo w_hi      (x_lo w_lo, ~2^-16 relative, is left out)

with f32 accumulation in the tiles: about f32's accuracy (mtmd itself rounds activations to f16
for F16 weights), at 3 x 8192 multiply-adds per 16x16x32 tile step.

Layouts (u16 bf16 bits). Weights, per pair p of 16-row blocks and per k-step s of 32:
    data[p, s, e, b, r, 2 n + j] = half_e(W[32 p + 16 b + n, 32 s + 2 r + j])   e: 0 hi, 1 lo
(TDPBF16PS's pair-interleaved B; rows past N and k past K are zeros). Activations, split per
call by `split_rows` (rows padded to 32 with zeros):
    xs[m, s, e, c] = half_e(x[m, 32 s + c])
or by `split_rows_f16`, each x rounded to f16 first (matmul_f16_input: an F16 weight's input
as ggml converts it, the encoder's F16 projections; twin `reference_f16_input`), whose halves
are then exact.
The kernel keeps a 32 x 32 block of out in 4 tiles (C00 C01 C10 C11), two A and two B tiles:

    for kb in k-steps by KS:                      a slice of x and W stays in L2
        for mb in M by MC:  for p in [p0, p1):  for m0 in mb by 32:
            C = kb ? out : 0                      (tiles past M16 / N16 are never loaded or stored)
            for s in kb: A = x_hi;  B = w_hi: C += A B;  B = w_lo: C += A B
                         A = x_lo;  B = w_hi: C += A B
            out = C

Every element's sum has one order whatever the thread count (threads take whole pairs), so
two threads give one thread's bits. `out` has M16 = ceil(M / 16) 16 rows and a row stride of at
least N16 (see AmxGemm.matmul, which pads when the caller's array cannot take it). Numpy twin:
`reference`. Used only where the CPU has amx-bf16 and the OS grants the tile state (`available`).
"""
from __future__ import annotations

import ctypes
import itertools
import math
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from engine.kernels import amx_state, jit
from engine.kernels.ir.builder import address
from engine.kernels.ir.consts import splat_const
from engine.kernels.ir.vectors import KernelFn
from engine.kernels.row_softmax import _DECLS as _SOFTMAX_DECLS
from engine.kernels.row_softmax import _exp as softmax_exp
from engine.kernels.row_softmax import _splat as softmax_splat

KSTEP = 32    # k per tile step (bf16 pairs: 64 bytes a row)
KS = 16       # k-steps per slice: 512 k, a 128-row block of x is 256 KB, a pair's W slice 64 KB
MC = 128      # rows of x per block (whole 32-row tile blocks)
CHUNKS_PER_THREAD = 4
_TILE = 1024  # bytes of one 16 x 64-byte tile
_DECLS = amx_state.TILE_DECLARATIONS + """declare void @llvm.x86.tdpbf16ps(i8 immarg, i8 immarg, i8 immarg)
declare <16 x float> @llvm.masked.load.v16f32.p0(ptr, i32 immarg, <16 x i1>, <16 x float>)
"""  # row_softmax's declarations (its e^x) are added beside these


def _gemm_ir() -> str:
    f = KernelFn("void @amx_gemm_bf16x3(ptr noalias %w, ptr noalias %xs, ptr noalias %out, "
                 "ptr %cfg, i64 %n_ks, i64 %p0, i64 %p1, i64 %m16, i64 %n_blocks, i64 %ldo) #0")
    f.do("call void @llvm.x86.ldtilecfg(ptr %cfg)")
    x_tiles = f.mul("%n_ks", 2 * _TILE)            # bytes of one 16-row block of xs
    w_pair = f.mul("%n_ks", 4 * _TILE)             # bytes of one pair's panel
    o_row = f.mul("%ldo", 4)
    n_m32 = f.let(f"udiv i64 {f.add('%m16', 31)}, 32")
    n_kb = f.let(f"udiv i64 {f.add('%n_ks', KS - 1)}, {KS}")
    n_mb = f.let(f"udiv i64 {f.add(n_m32, MC // 32 - 1)}, {MC // 32}")

    def k_slice(kb: str) -> None:
        s0 = f.mul(kb, KS)
        s1 = f.add(s0, KS)
        s1 = f.let(f"select i1 {f.let(f'icmp ult i64 {s1}, %n_ks')}, i64 {s1}, i64 %n_ks")
        first = f.let(f"icmp eq i64 {kb}, 0")

        def m_block(mb: str) -> None:
            t0 = f.mul(mb, MC // 32)
            t1 = f.add(t0, MC // 32)
            t1 = f.let(f"select i1 {f.let(f'icmp ult i64 {t1}, {n_m32}')}, i64 {t1}, i64 {n_m32}")

            def one_pair(p: str) -> None:
                wp = f.gep("%w", f.mul(p, w_pair))
                has_b1 = f.let(f"icmp ult i64 {f.add(f.mul(p, 2), 1)}, %n_blocks")
                n0 = f.mul(p, 32 * 4)  # byte column of the pair in out

                def tile_block(t: str) -> None:
                    m0 = f.mul(t, 32)
                    has_a1 = f.let(f"icmp ult i64 {f.add(m0, 16)}, %m16")
                    o0 = f.gep("%out", f.add(f.mul(m0, o_row), n0))
                    o1 = f.gep(o0, f.mul(o_row, 16))
                    # C tile (reg, out address, exists)
                    cs = [(0, o0, None), (1, f.gep(o0, 64), has_b1),
                          (2, o1, has_a1), (3, f.gep(o1, 64), f.let(f"and i1 {has_a1}, {has_b1}"))]
                    for reg, addr, cond in cs:
                        def load_c(reg: int = reg, addr: str = addr) -> None:
                            f.do(f"call void @llvm.x86.tileloadd64(i8 {reg}, ptr {addr}, i64 {o_row})")

                        def zero_c(reg: int = reg) -> None:
                            f.do(f"call void @llvm.x86.tilezero(i8 {reg})")
                        later = f.let(f"xor i1 {first}, true")
                        load = later if cond is None else f.let(f"and i1 {later}, {cond}")
                        f.if_then(load, load_c)
                        f.if_then(f.let(f"xor i1 {load}, true"), zero_c)
                    xa0 = f.gep("%xs", f.mul(f.mul(t, 2), x_tiles))
                    xa1 = f.gep(xa0, x_tiles)

                    def step(s: str) -> None:
                        xo = f.mul(s, 2 * _TILE)
                        wo = f.gep(wp, f.mul(s, 4 * _TILE))

                        def load(reg: int, addr: str) -> None:
                            f.do(f"call void @llvm.x86.tileloadd64(i8 {reg}, ptr {addr}, i64 64)")

                        def tdp(c: int, a: int, b: int) -> None:
                            f.do(f"call void @llvm.x86.tdpbf16ps(i8 {c}, i8 {a}, i8 {b})")

                        # each load as late as its first use and as far as it can be from the
                        # last use of the tile it overwrites (tiles are not renamed)
                        xl0, xl1 = f.gep(xa0, f.add(xo, _TILE)), f.gep(xa1, f.add(xo, _TILE))
                        for a0, a1, b0, b1 in ((f.gep(xa0, xo), f.gep(xa1, xo), wo, f.gep(wo, _TILE)),
                                               (None, None, f.gep(wo, 2 * _TILE), f.gep(wo, 3 * _TILE)),
                                               (xl0, xl1, wo, f.gep(wo, _TILE))):
                            if a0 is not None:
                                load(4, a0)
                            load(6, b0)
                            tdp(0, 4, 6)
                            if a1 is not None:
                                load(5, a1)
                            tdp(2, 5, 6)
                            load(7, b1)
                            tdp(1, 4, 7)
                            tdp(3, 5, 7)

                    f.loop_range(s0, s1, step)
                    for reg, addr, cond in cs:
                        def store_c(reg: int = reg, addr: str = addr) -> None:
                            f.do(f"call void @llvm.x86.tilestored64(i8 {reg}, ptr {addr}, i64 {o_row})")
                        if cond is None:
                            store_c()
                        else:
                            f.if_then(cond, store_c)

                f.loop_range(t0, t1, tile_block)

            f.loop_range("%p0", "%p1", one_pair)

        f.each(n_mb, m_block)

    f.each(n_kb, k_slice)
    f.do("call void @llvm.x86.tilerelease()")
    f.do("ret void")
    return f.text()


_V16I, _V16F = "<16 x i32>", "<16 x float>"
_LANES = "<16 x i64> <" + ", ".join(f"i64 {j}" for j in range(16)) + ">"


def _masked_row(f: KernelFn, base: str, n_left: str) -> str:
    """16 floats at base, lanes >= n_left (signed) read as zero."""
    lim = f.let(f"insertelement <16 x i64> poison, i64 {n_left}, i64 0")
    lim = f.let(f"shufflevector <16 x i64> {lim}, <16 x i64> poison, <16 x i32> zeroinitializer")
    mask = f.let(f"icmp slt {_LANES}, {lim}")
    return f.let(f"call {_V16F} @llvm.masked.load.v16f32.p0(ptr {base}, i32 4, <16 x i1> {mask}, "
                 f"{_V16F} zeroinitializer)")


def _halves(f: KernelFn, v: str) -> tuple[str, str]:
    """<16 x float> -> its (hi, lo) bf16 bits as <16 x i16>: `split`'s rule."""
    c_himask, c16, c1, c7fff = (splat_const("i32", 16, c) for c in (-65536, 16, 1, 0x7FFF))
    bits = f.let(f"bitcast {_V16F} {v} to {_V16I}")
    hi = f.let(f"and {_V16I} {bits}, {c_himask}")
    lo = f.let(f"fsub {_V16F} {v}, {f.let(f'bitcast {_V16I} {hi} to {_V16F}')}")
    lb = f.let(f"bitcast {_V16F} {lo} to {_V16I}")
    odd = f.let(f"and {_V16I} {f.let(f'lshr {_V16I} {lb}, {c16}')}, {c1}")
    lb = f.let(f"add {_V16I} {lb}, {f.let(f'add {_V16I} {odd}, {c7fff}')}")
    h16 = f.let(f"trunc {_V16I} {f.let(f'lshr {_V16I} {bits}, {c16}')} to <16 x i16>")
    l16 = f.let(f"trunc {_V16I} {f.let(f'lshr {_V16I} {lb}, {c16}')} to <16 x i16>")
    return h16, l16


def _split_ir(name: str = "split_rows", f16: bool = False) -> str:
    """split_rows(x, xs, r0, r1, K, n_ks, x_row): rows [r0, r1) of float32 x (row stride x_row
    floats) -> their bf16 halves in xs' layout, k past K zero. With `f16` (split_rows_f16)
    each value is rounded to f16 first (round to nearest even, as engine.kernels.f16_round):
    an F16 weight's input as ggml converts it, whose halves are then exact."""
    f = KernelFn(f"void @{name}(ptr noalias %x, ptr noalias %xs, i64 %r0, i64 %r1, i64 %K, "
                 "i64 %n_ks, i64 %x_row) #0")
    x_row = f.mul("%x_row", 4)
    xs_block = f.mul("%n_ks", 2 * _TILE)

    def row(i: str) -> None:
        xr = f.gep("%x", f.mul(i, x_row))
        sr = f.gep("%xs", f.add(f.mul(f.let(f"lshr i64 {i}, 4"), xs_block),
                                f.mul(f.let(f"and i64 {i}, 15"), 2 * KSTEP)))

        def half(j: str) -> None:  # 16 values at k = 16 j
            k0 = f.mul(j, 16)
            v = _masked_row(f, f.gep(xr, f.mul(k0, 4)), f.let(f"sub i64 %K, {k0}"))
            if f16:
                v = f.let(f"fpext <16 x half> {f.let(f'fptrunc {_V16F} {v} to <16 x half>')} to {_V16F}")
            h16, l16 = _halves(f, v)
            # k-step s = j / 2, lanes (j % 2) * 16: hi at [s, 0], lo at [s, 1]
            s = f.let(f"lshr i64 {j}, 1")
            base = f.add(f.mul(s, 2 * _TILE), f.mul(f.let(f"and i64 {j}, 1"), 32))
            f.store("<16 x i16>", h16, sr, base, 2)
            f.store("<16 x i16>", l16, sr, f.add(base, _TILE), 2)

        f.each(f.mul("%n_ks", 2), half)

    f.loop_range("%r0", "%r1", row)
    f.do("ret void")
    return f.text()


def _pack_rows_ir() -> str:
    """pack_rows(w, dst, N, K, n_ks, ld): float32 W [N, K] (row stride ld floats) -> `pack`'s
    layout in dst, which the caller zeroed (rows past N stay zero)."""
    f = KernelFn("void @pack_rows(ptr noalias %w, ptr noalias %dst, i64 %N, i64 %K, i64 %n_ks, "
                 "i64 %ld) #0")
    w_row = f.mul("%ld", 4)

    def row(i: str) -> None:
        wr = f.gep("%w", f.mul(i, w_row))
        p, b, n = f.let(f"lshr i64 {i}, 5"), f.let(f"and i64 {f.let(f'lshr i64 {i}, 4')}, 1"), \
            f.let(f"and i64 {i}, 15")
        col = f.gep("%dst", f.add(f.add(f.mul(f.mul(p, "%n_ks"), 4 * _TILE), f.mul(b, _TILE)),
                                  f.mul(n, 4)))

        def step(s: str) -> None:
            k0 = f.mul(s, KSTEP)
            at = f.gep(col, f.mul(s, 4 * _TILE))
            parts = [_halves(f, _masked_row(f, f.gep(wr, f.mul(f.add(k0, 16 * q), 4)),
                                            f.let(f"sub i64 %K, {f.add(k0, 16 * q)}"))) for q in (0, 1)]
            for e in (0, 1):  # k pair r = elements 2r, 2r + 1 of the step: one u32 at row r
                both = f.let(f"shufflevector <16 x i16> {parts[0][e]}, <16 x i16> {parts[1][e]}, "
                             "<32 x i32> <" + ", ".join(f"i32 {j}" for j in range(32)) + ">")
                pairs = f.let(f"bitcast <32 x i16> {both} to {_V16I}")
                for r in range(16):
                    f.store("i32", f.let(f"extractelement {_V16I} {pairs}, i64 {r}"), at,
                            e * 2 * _TILE + r * 64, 4)

        f.each("%n_ks", step)

    f.each("%N", row)
    f.do("ret void")
    return f.text()


def _pack_cols_ir() -> str:
    """pack_cols(v, dst, n_keys, D, n_ks, ld): float32 V [n_keys, D] (row stride ld floats) ->
    `pack`'s layout of V^T [D, n_keys] in dst, which the caller zeroed (dims past D stay zero):
    rows 2r and 2r + 1 of a k-step, 16 dims of a block, interleave into one 64-byte tile row."""
    f = KernelFn("void @pack_cols(ptr noalias %v, ptr noalias %dst, i64 %n_keys, i64 %D, "
                 "i64 %n_ks, i64 %ld) #0")
    v_row = f.mul("%ld", 4)
    n_pairs_keys = f.mul("%n_ks", 16)
    n_blocks = f.let(f"udiv i64 {f.add('%D', 15)}, 16")
    zip_mask = "<32 x i32> <" + ", ".join(f"i32 {j // 2 + 16 * (j % 2)}" for j in range(32)) + ">"

    def key_pair(q: str) -> None:  # keys 2q, 2q + 1: k-step q / 16, row q % 16
        s, r = f.let(f"lshr i64 {q}, 4"), f.let(f"and i64 {q}, 15")
        k0 = f.mul(q, 2)
        rows = [f.gep("%v", f.mul(f.add(k0, j), v_row)) for j in (0, 1)]
        live = [f.let(f"icmp ult i64 {f.add(k0, j)}, %n_keys") for j in (0, 1)]

        def block(g: str) -> None:
            d0 = f.mul(g, 16)
            left = f.let(f"sub i64 %D, {d0}")
            halves = []
            for j in (0, 1):
                n_left = f.select(live[j], "i64", left, "0")
                halves.append(_halves(f, _masked_row(f, f.gep(rows[j], f.mul(d0, 4)), n_left)))
            p, b = f.let(f"lshr i64 {g}, 1"), f.let(f"and i64 {g}, 1")
            at = f.gep("%dst", f.add(f.add(f.mul(f.add(f.mul(p, "%n_ks"), s), 4 * _TILE),
                                           f.mul(b, _TILE)), f.mul(r, 64)))
            for e in (0, 1):
                z = f.let(f"shufflevector <16 x i16> {halves[0][e]}, <16 x i16> {halves[1][e]}, {zip_mask}")
                f.store("<32 x i16>", z, at, e * 2 * _TILE, 2)

        f.each(n_blocks, block)

    f.each(n_pairs_keys, key_pair)
    f.do("ret void")
    return f.text()


def _softmax_split_ir() -> str:
    """softmax_split(x, xs, r0, r1, n, n_ks): row_softmax's softmax of rows [r0, r1) of float32
    x [rows, n] (n % 16 == 0; x keeps e^(x - max)), its result written as split_rows' halves:
    the bits of softmax_rows then split_rows, one pass over the scores fewer."""
    f = KernelFn("void @softmax_split(ptr noalias %x, ptr noalias %xs, i64 %r0, i64 %r1, i64 %n, "
                 "i64 %n_ks) #0")
    n_vec = f.let("udiv i64 %n, 16")
    row_bytes = f.mul("%n", 4)
    xs_block = f.mul("%n_ks", 2 * _TILE)

    def row(i: str) -> None:
        base = f.gep("%x", f.mul(i, row_bytes))
        sr = f.gep("%xs", f.add(f.mul(f.let(f"lshr i64 {i}, 4"), xs_block),
                                f.mul(f.let(f"and i64 {i}, 15"), 2 * KSTEP)))

        def at(j: str) -> str:
            return f.gep(base, f.mul(j, 64))

        def find_max(j: str, c: list[str]) -> list[str]:
            v = f.load(_V16F, at(j), 0, 4)
            return [f.let(f"call {_V16F} @llvm.maxnum.v16f32({_V16F} {c[0]}, {_V16F} {v})")]

        mv = f.loop(n_vec, [(_V16F, softmax_splat(-math.inf))], find_max)[0]
        ms = f.splat_float(f.let(f"call float @llvm.vector.reduce.fmax.v16f32({_V16F} {mv})"), 16)

        def exponentiate(j: str, c: list[str]) -> list[str]:
            e = softmax_exp(f, f.let(f"fsub {_V16F} {f.load(_V16F, at(j), 0, 4)}, {ms}"))
            f.store(_V16F, e, at(j), 0, 4)
            return [f.let(f"fadd {_V16F} {c[0]}, {e}")]

        sv = f.loop(n_vec, [(_V16F, "zeroinitializer")], exponentiate)[0]
        total = f.let(f"call reassoc float @llvm.vector.reduce.fadd.v16f32(float -0.0, {_V16F} {sv})")
        inv = f.splat_float(f.let(f"fdiv float 1.0, {total}"), 16)

        def write(j: str) -> None:
            h16, l16 = _halves(f, f.let(f"fmul {_V16F} {f.load(_V16F, at(j), 0, 4)}, {inv}"))
            off = f.add(f.mul(f.let(f"lshr i64 {j}, 1"), 2 * _TILE), f.mul(f.let(f"and i64 {j}, 1"), 32))
            f.store("<16 x i16>", h16, sr, off, 2)
            f.store("<16 x i16>", l16, sr, f.add(off, _TILE), 2)

        f.each(n_vec, write)

        def pad(j: str) -> None:  # k past n in the last k-step: zeros
            off = f.add(f.mul(f.let(f"lshr i64 {j}, 1"), 2 * _TILE), f.mul(f.let(f"and i64 {j}, 1"), 32))
            for e in (0, 1):
                f.store("<16 x i16>", "zeroinitializer", sr, f.add(off, e * _TILE), 2)

        f.loop_range(n_vec, f.mul("%n_ks", 2), pad)

    f.loop_range("%r0", "%r1", row)
    f.do("ret void")
    return f.text()


def build_ir() -> str:
    return (_DECLS + _SOFTMAX_DECLS + _gemm_ir() + _split_ir() + _split_ir("split_rows_f16", f16=True)
            + _pack_rows_ir() + _pack_cols_ir() + _softmax_split_ir()
            + 'attributes #0 = { "min-legal-vector-width"="512" "target-features"="+amx-tile,+amx-bf16" }\n')


# --- the halves, in numpy (packing and the twin) ---------------------------------------------

def split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 -> (hi, lo) bf16 bits as uint16: hi truncated, lo = RNE(a - hi)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    hi = bits & np.uint32(0xFFFF0000)
    lo = (bits.view(np.float32) - hi.view(np.float32)).view(np.uint32)
    lo = lo + np.uint32(0x7FFF) + ((lo >> np.uint32(16)) & np.uint32(1))
    return (hi >> np.uint32(16)).astype(np.uint16), (lo >> np.uint32(16)).astype(np.uint16)


def widen(h: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float64."""
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def reference(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The numpy twin: out [M, N] = x_hi w_hi + x_hi w_lo + x_lo w_hi in float64, W [N, K]."""
    wh, wl = (widen(h) for h in split(np.asarray(w, np.float32)))
    xh, xl = (widen(h) for h in split(np.asarray(x, np.float32)))
    out: np.ndarray = xh @ wh.T + xh @ wl.T + xl @ wh.T
    return out


def reference_f16_input(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The twin of matmul_f16_input: `reference` of x rounded to f16 (its halves exact, so only
    x_lo w_lo, ~2^-16 of a term, is left out of the f16 x f16 product ggml sums)."""
    with np.errstate(over="ignore"):
        return reference(w, np.asarray(x, np.float32).astype(np.float16).astype(np.float32))


def pack(w: np.ndarray) -> np.ndarray:
    """W [N, K] float16/float32 -> uint16 [n_pairs, n_ks, 2 (hi, lo), 2 (block), 16, 32]."""
    n, k = w.shape
    n_pairs, n_ks = -(-n // 32), -(-k // KSTEP)
    padded = np.zeros((n_pairs * 32, n_ks * KSTEP), np.float32)
    padded[:n, :k] = w
    out = np.empty((n_pairs, n_ks, 2, 2, 16, 32), np.uint16)
    for e, h in enumerate(split(padded)):
        # h[32 p + 16 b + n, 32 s + 2 r + j] -> [p, s, b, r, n, j]
        t = h.reshape(n_pairs, 2, 16, n_ks, 16, 2).transpose(0, 3, 1, 4, 2, 5)
        out[:, :, e] = t.reshape(n_pairs, n_ks, 2, 16, 32)
    return out


@dataclass(frozen=True)
class AmxMatrix:
    """A weight matrix packed for AmxGemm (`pack`'s layout)."""
    data: np.ndarray
    n_rows: int
    n_cols: int

    @classmethod
    def pack(cls, w: np.ndarray) -> AmxMatrix:
        if w.dtype not in (np.float16, np.float32) or w.ndim != 2:
            raise ValueError(f"AMX panels take a 2-D float16 or float32 matrix, got {w.dtype} {w.shape}")
        return cls(pack(w), w.shape[0], w.shape[1])

    @property
    def n_ks(self) -> int:
        return int(self.data.shape[1])

    @property
    def n_pairs(self) -> int:
        return int(self.data.shape[0])


# --- availability: the CPU flag, then the kernel's permission to use the tile state -----------

def available() -> bool:
    """amx-bf16 on the CPU and the tile data state granted to this process (engine.kernels.amx_state)."""
    return amx_state.available("amx-bf16")


def _zero_padding(xs: np.ndarray, m: int) -> None:
    """Rows m.. of halves xs (up to its whole 32-row blocks) zero."""
    blk, r = divmod(m, 16)
    if r:
        xs[blk, :, :, r:] = 0
    xs[blk + (r > 0):] = 0


def _tile_config() -> np.ndarray:
    """ldtilecfg's 64 bytes: palette 1, tiles 0-7 of 16 rows x 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    cfg[16:32].view(np.uint16)[:8] = 64
    cfg[48:56] = 16
    return cfg


class AmxGemm:
    """The compiled kernels; `matmul` splits the pairs into CHUNKS_PER_THREAD chunks per thread
    of `executor` (as PanelGemm does), the activations' split by rows the same way."""

    def __init__(self, executor: Executor | None = None, n_threads: int = 1) -> None:
        if not available():
            raise RuntimeError("AMX-BF16 is not available on this machine")
        lib = jit.compile_cached("amx_gemm", (KSTEP, KS, MC), build_ir)
        self._gemm = lib.function("amx_gemm_bf16x3", None, *(ctypes.c_void_p,) * 4, *(ctypes.c_int64,) * 6)
        self._split = lib.function("split_rows", None, ctypes.c_void_p, ctypes.c_void_p, *(ctypes.c_int64,) * 5)
        self._split_f16 = lib.function("split_rows_f16", None, ctypes.c_void_p, ctypes.c_void_p,
                                       *(ctypes.c_int64,) * 5)
        self._pack_rows = lib.function("pack_rows", None, ctypes.c_void_p, ctypes.c_void_p, *(ctypes.c_int64,) * 4)
        self._pack_cols = lib.function("pack_cols", None, ctypes.c_void_p, ctypes.c_void_p, *(ctypes.c_int64,) * 4)
        self._softmax_split = lib.function("softmax_split", None, ctypes.c_void_p, ctypes.c_void_p,
                                           *(ctypes.c_int64,) * 4)
        self._cfg = _tile_config()
        self._executor, self._n_threads = executor, n_threads
        self._scratch = threading.local()

    def pack_rows(self, w: np.ndarray) -> AmxMatrix:
        """float32 W [N, K] (rows contiguous, e.g. one head's columns of K) -> AmxMatrix; `pack`
        is the twin."""
        n, k = w.shape
        if w.dtype != np.float32 or w.strides[1] != 4:
            raise ValueError("pack_rows takes float32 rows with contiguous elements")
        data = np.zeros((-(-n // 32), -(-k // KSTEP), 2, 2, 16, 32), np.uint16)
        self._pack_rows(address(w), address(data), n, k, data.shape[1], w.strides[0] // 4)
        return AmxMatrix(data, n, k)

    def pack_cols(self, v: np.ndarray) -> AmxMatrix:
        """float32 V [n_keys, D] (rows contiguous) -> AmxMatrix of V^T [D, n_keys]; the twin is
        `pack(V.T)`."""
        n_keys, d = v.shape
        if v.dtype != np.float32 or v.strides[1] != 4:
            raise ValueError("pack_cols takes float32 rows with contiguous elements")
        data = np.zeros((-(-d // 32), -(-n_keys // KSTEP), 2, 2, 16, 32), np.uint16)
        self._pack_cols(address(v), address(data), n_keys, d, data.shape[1], v.strides[0] // 4)
        return AmxMatrix(data, d, n_keys)

    def _map(self, fn: Callable[[tuple[int, int]], None], items: list[tuple[int, int]]) -> None:
        if self._executor is not None and self._n_threads > 1 and len(items) > 1:
            list(self._executor.map(fn, items))
        else:
            for it in items:
                fn(it)

    def split_rows(self, x: np.ndarray, n_ks: int, threads: bool = True) -> np.ndarray:
        """x float32 [M, K] (rows contiguous) -> its halves, [ceil(M / 32) 2, n_ks, 2, 16, 32]
        (rows past M zero)."""
        return self._split_with(self._split, x, n_ks, threads)

    def split_rows_f16(self, x: np.ndarray, n_ks: int, threads: bool = True) -> np.ndarray:
        """split_rows of x rounded to f16 (one pass; the twin: split_rows(round_f16(x)))."""
        return self._split_with(self._split_f16, x, n_ks, threads)

    def _split_with(self, split: Callable[..., None], x: np.ndarray, n_ks: int,
                    threads: bool) -> np.ndarray:
        m, k = x.shape
        mp = -(-m // 32) * 32
        xs = np.empty((mp // 16, n_ks, 2, 16, KSTEP), np.uint16)
        if m == 0:
            return xs
        _zero_padding(xs, m)
        ld = x.strides[0] // 4
        n_chunks = min(-(-m // 64), CHUNKS_PER_THREAD * self._n_threads) if threads else 1
        edges = [m * c // n_chunks for c in range(n_chunks + 1)]

        def run(r: tuple[int, int]) -> None:
            split(address(x), address(xs), r[0], r[1], k, n_ks, ld)
        items = [r for r in itertools.pairwise(edges) if r[0] < r[1]]
        if threads:
            self._map(run, items)
        else:
            for r in items:
                run(r)
        return xs

    def softmax_split(self, s: np.ndarray, n_ks: int) -> np.ndarray:
        """Softmax of score rows s float32 [M, n] (C-contiguous, n % 16 == 0) as split_rows'
        halves for a product with n_ks k-steps (on the calling thread; s is left holding
        e^(s - max))."""
        m, n = s.shape
        if s.dtype != np.float32 or not s.flags.c_contiguous or n % 16 or n_ks * KSTEP < n:
            raise ValueError(f"softmax_split takes C-contiguous float32 [M, 16 k], got {s.dtype} {s.shape}")
        mp = -(-m // 32) * 32
        xs = np.empty((mp // 16, n_ks, 2, 16, KSTEP), np.uint16)
        _zero_padding(xs, m)
        self._softmax_split(address(s), address(xs), 0, m, n, n_ks)
        return xs

    def matmul(self, w: AmxMatrix, x: np.ndarray, out: np.ndarray | None = None,
               threads: bool = True) -> np.ndarray:
        """out [M, N] = x [M, K] @ W^T; out may be given (C-contiguous float32 [M, N])."""
        return self._matmul_with(self.split_rows, w, x, out, threads)

    def matmul_f16_input(self, w: AmxMatrix, x: np.ndarray, out: np.ndarray | None = None,
                         threads: bool = True) -> np.ndarray:
        """out = f16(x) @ W^T: x rounded to f16 on the way into its halves, as ggml converts an
        F16 weight's input (the encoder's F16 projections); twin `reference_f16_input`."""
        return self._matmul_with(self.split_rows_f16, w, x, out, threads)

    def _matmul_with(self, split: Callable[[np.ndarray, int, bool], np.ndarray], w: AmxMatrix,
                     x: np.ndarray, out: np.ndarray | None, threads: bool) -> np.ndarray:
        if x.ndim != 2 or x.shape[1] != w.n_cols or x.dtype != np.float32 or x.strides[1] != 4:
            raise ValueError(f"x must be float32 [M, {w.n_cols}] with contiguous rows, got {x.dtype} {x.shape}")
        m, n = x.shape[0], w.n_rows
        if out is None:
            out = np.empty((m, n), np.float32)
        elif out.shape != (m, n) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {(m, n)}")
        if m == 0:
            return out
        return self.matmul_halves(w, split(x, w.n_ks, threads), out, threads)

    def matmul_halves(self, w: AmxMatrix, xs: np.ndarray, out: np.ndarray,
                      threads: bool = True) -> np.ndarray:
        """out [M, N] = x @ W^T from x's halves (split_rows or softmax_split)."""
        m, n = out.shape
        if xs.shape[1] != w.n_ks or xs.shape[0] * 16 < m or n != w.n_rows:
            raise ValueError(f"halves {xs.shape} and out {out.shape} do not fit W [{w.n_rows}, {w.n_cols}]")
        m16, n16 = -(-m // 16) * 16, -(-n // 16) * 16
        direct = m16 == m and n16 == n
        dst = out if direct else np.empty((m16, n16), np.float32)
        n_blocks = n16 // 16
        args = (w.data.ctypes.data, address(xs), address(dst), address(self._cfg), w.n_ks)
        tail = (m16, n_blocks, dst.shape[1])
        n_chunks = min(w.n_pairs, CHUNKS_PER_THREAD * self._n_threads) if threads else 1
        edges = [w.n_pairs * c // n_chunks for c in range(n_chunks + 1)]
        ranges = [r for r in itertools.pairwise(edges) if r[0] < r[1]]
        if threads:
            self._map(lambda r: self._gemm(*args, r[0], r[1], *tail), ranges)
        else:
            self._gemm(*args, 0, w.n_pairs, *tail)
        if not direct:
            out[:] = dst[:m, :n]
        return out
