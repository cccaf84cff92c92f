"""Compiled repacking (engine.formats.repack's layouts): LLVM IR builders and the ctypes call.

    repack_<type>(src, dst, row_bytes, nb, g0, g1)
        groups [g0, g1) of 16 file rows (src: row r at src + r * row_bytes, ggml's blocks)
        -> dst, the groups' interleaved blocks (engine.formats.repack.GROUP_BLOCK_BYTES each)

The same bytes as engine.formats.repack's numpy repacking, which stays the twin (tests/engine/test_gemm.py
compares them). Plain scalar loads and stores, one 4-byte word at a time (each group block is
a 16-row transpose of words): 5632 x 2048 Q8_0 in 1.9 ms (6.4 GB/s) where numpy took ~20.
What is left of a load is mostly the kernel handing out fresh pages (engine.formats.repack._aligned).
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import numpy as np

from engine.formats.quants import QuantMatrix
from engine.formats.repack import GROUP_BLOCK_BYTES, ROWS, T
from engine.kernels import jit
from engine.kernels.ir.text import IRFunction

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


def _q8_0_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (f16 d | i8 qs[32]) of 16 rows -> qs u8 [8][16][4] (q + 128) | d f16 [16]."""
    for r, s in enumerate(src):
        for c in range(8):
            word = f.let(f"xor i32 {f.load('i32', s, 2 + 4 * c)}, {0x80808080 - (1 << 32)}")
            f.store("i32", word, dst, 64 * c + 4 * r)
        f.store("i16", f.load("i16", s, 0), dst, 512 + 2 * r)


def _q4_0_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (f16 d | qs[16]) of 16 rows -> qs [4][16][4] | d [16]."""
    for r, s in enumerate(src):
        for k in range(4):
            f.store("i32", f.load("i32", s, 2 + 4 * k), dst, 64 * k + 4 * r)
        f.store("i16", f.load("i16", s, 0), dst, 256 + 2 * r)


def _q5_0_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (f16 d | u32 qh | qs[16]) of 16 rows -> qs [4][16][4] | qh [16] | d [16]."""
    for r, s in enumerate(src):
        for k in range(4):
            f.store("i32", f.load("i32", s, 6 + 4 * k), dst, 64 * k + 4 * r)
        f.store("i32", f.load("i32", s, 2), dst, 256 + 4 * r)
        f.store("i16", f.load("i16", s, 0), dst, 320 + 2 * r)


def _q4_k_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (f16 d, dmin | scales[12] | qs[128]) of 16 rows -> d [16] | dmin [16] |
    sc u8 [8][16] | mn u8 [8][16] | qs [4 pairs][8 chunks][16][4] (engine.formats.repack)."""
    _k_block(f, src, dst, qh=False)


def _q5_k_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (f16 d, dmin | scales[12] | qh[32] | qs[128]) of 16 rows -> Q4_K's with
    qh [8 chunks][16][4] between the mins and qs (engine.formats.repack)."""
    _k_block(f, src, dst, qh=True)


def _k_block(f: IRFunction, src: list[str], dst: str, qh: bool) -> None:
    qs_src, qs_dst = (48, 832) if qh else (16, 320)
    for r, s in enumerate(src):
        f.store("i16", f.load("i16", s, 0), dst, 2 * r)
        f.store("i16", f.load("i16", s, 2), dst, 32 + 2 * r)
        b = [f.load("i8", s, 4 + k) for k in range(12)]

        def bits(v: str, op: str, k: int) -> str:
            return f.let(f"{op} i8 {v}, {k}")

        for j in range(8):
            if j < 4:
                sc, mn = bits(b[j], "and", 63), bits(b[j + 4], "and", 63)
            else:
                sc = f.let(f"or i8 {bits(b[j + 4], 'and', 15)}, {bits(bits(b[j - 4], 'lshr', 6), 'shl', 4)}")
                mn = f.let(f"or i8 {bits(b[j + 4], 'lshr', 4)}, {bits(bits(b[j], 'lshr', 6), 'shl', 4)}")
            f.store("i8", sc, dst, 64 + 16 * j + r)
            f.store("i8", mn, dst, 192 + 16 * j + r)
        if qh:
            for c in range(8):  # qh word c -> chunk c, row r
                f.store("i32", f.load("i32", s, 16 + 4 * c), dst, 320 + 64 * c + 4 * r)
        for w in range(32):  # qs word 8p + c -> pair p, chunk c, row r
            f.store("i32", f.load("i32", s, qs_src + 4 * w), dst, qs_dst + 64 * w + 4 * r)


def _q2_k_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (scales[16] | qs[64] | f16 d, dmin) of 16 rows -> d [16] | dmin [16] |
    sc u8 [16][16] | mn u8 [16][16] | qs [2][8][16][4] (engine.formats.repack)."""
    for r, s in enumerate(src):
        f.store("i16", f.load("i16", s, 80), dst, 2 * r)
        f.store("i16", f.load("i16", s, 82), dst, 32 + 2 * r)
        for g in range(16):
            packed = f.load("i8", s, g)
            f.store("i8", f.let(f"and i8 {packed}, 15"), dst, 64 + 16 * g + r)
            f.store("i8", f.let(f"lshr i8 {packed}, 4"), dst, 320 + 16 * g + r)
        for w in range(16):  # qs word 8h + c -> half h, chunk c, row r
            f.store("i32", f.load("i32", s, 16 + 4 * w), dst, 576 + 64 * w + 4 * r)


def _q3_k_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (hmask[32] | qs[64] | scales[12] | f16 d) of 16 rows -> d [16] |
    sc i8 [16][16] (the 6-bit scales - 32) | hm [8][16][4] | qs [2][8][16][4] (engine.formats.repack)."""
    for r, s in enumerate(src):
        f.store("i16", f.load("i16", s, 108), dst, 2 * r)
        for k in range(16):  # low 4 bits: byte k % 8's low (k < 8) or high nibble; top 2: byte 8 + k % 4
            low = f.load("i8", s, 96 + k % 8)
            low = f.let(f"and i8 {f.let(f'lshr i8 {low}, 4') if k >= 8 else low}, 15")
            top = f.let(f"lshr i8 {f.load('i8', s, 104 + k % 4)}, {2 * (k // 4)}")
            top = f.let(f"and i8 {top}, 3")
            sc = f.let(f"or i8 {low}, {f.let(f'shl i8 {top}, 4')}")
            f.store("i8", f.let(f"sub i8 {sc}, 32"), dst, 32 + 16 * k + r)
        for c in range(8):
            f.store("i32", f.load("i32", s, 4 * c), dst, 288 + 64 * c + 4 * r)
        for w in range(16):
            f.store("i32", f.load("i32", s, 32 + 4 * w), dst, 800 + 64 * w + 4 * r)


def _iq4_xs_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (f16 d | u16 scales_h | scales_l[4] | qs[128]) of 16 rows -> d [16] |
    sc i8 [8][16] (ls - 32) | qs [8 sub-blocks][4][16][4] (engine.formats.repack)."""
    for r, s in enumerate(src):
        f.store("i16", f.load("i16", s, 0), dst, 2 * r)
        high = f.load("i16", s, 2)
        for j in range(8):
            low = f.let(f"lshr i8 {f.load('i8', s, 4 + j // 2)}, {4 * (j % 2)}")
            top = f.let(f"and i16 {f.let(f'lshr i16 {high}, {2 * j}')}, 3")
            top = f.let(f"shl i8 {f.let(f'trunc i16 {top} to i8')}, 4")
            ls = f.let(f"or i8 {f.let(f'and i8 {low}, 15')}, {top}")
            f.store("i8", f.let(f"sub i8 {ls}, 32"), dst, 32 + 16 * j + r)
        for w in range(32):  # qs word 4j + k -> sub-block j, k, row r
            f.store("i32", f.load("i32", s, 8 + 4 * w), dst, 160 + 64 * w + 4 * r)


def _q6_k_block(f: IRFunction, src: list[str], dst: str) -> None:
    """File block (ql[128] | qh[64] | i8 scales[16] | f16 d) of 16 rows -> d [16] |
    sc [16][16] | 8 steps of ql' [4][16][4] | qh' [2][16][4] (engine.formats.repack). Four values at
    a time in an i32 (every byte op below stays inside its byte)."""
    m4, m2 = 0x0F0F0F0F, 0x03030303

    def op(a: str, o: str, b: int | str) -> str:
        return f.let(f"{o} i32 {a}, {b}")

    for r, s in enumerate(src):
        f.store("i16", f.load("i16", s, 208), dst, 2 * r)
        for j in range(16):
            f.store("i8", f.load("i8", s, 192 + j), dst, 32 + 16 * j + r)
        q = []  # chunk c: values 4c..4c+3 (6 bits each) as the bytes of one i32
        for c in range(64):
            h, v, l0 = c // 32, (c % 32) // 8, 4 * (c % 8)
            ql = f.load("i32", s, 64 * h + 32 * (v & 1) + l0)
            nib = op(ql if v < 2 else op(ql, "lshr", 4), "and", m4)
            top = op(op(f.load("i32", s, 128 + 32 * h + l0), "lshr", 2 * v), "and", m2)
            q.append(op(nib, "or", op(top, "shl", 4)))
        for st in range(8):
            at = 288 + 384 * st
            for i in range(4):
                lo, hi = q[4 * st + i], q[32 + 4 * st + i]
                word = op(op(lo, "and", m4), "or", op(op(hi, "and", m4), "shl", 4))
                f.store("i32", word, dst, at + 64 * i + 4 * r)
            for p in range(2):
                fields = [q[4 * st + 2 * p], q[4 * st + 2 * p + 1], q[32 + 4 * st + 2 * p],
                          q[32 + 4 * st + 2 * p + 1]]
                word = "0"
                for k, value in enumerate(fields):
                    word = op(word, "or", op(op(op(value, "lshr", 4), "and", m2), "shl", 2 * k))
                f.store("i32", word, dst, at + 256 + 64 * p + 4 * r)


_BLOCKS: dict[T, tuple[int, Callable[[IRFunction, list[str], str], None]]] = {
    T.Q8_0: (34, _q8_0_block),
    T.Q4_0: (18, _q4_0_block),
    T.IQ4_NL: (18, _q4_0_block),  # the same block shape: f16 d | 16 bytes of nibbles
    T.Q5_0: (22, _q5_0_block),
    T.Q2_K: (84, _q2_k_block),
    T.Q3_K: (110, _q3_k_block),
    T.Q4_K: (144, _q4_k_block),
    T.Q5_K: (176, _q5_k_block),
    T.Q6_K: (210, _q6_k_block),
    T.IQ4_XS: (136, _iq4_xs_block),
}
COMPILED = tuple(_BLOCKS)


def build_repack_ir(qtype: T) -> str:
    block_bytes, block = _BLOCKS[qtype]
    out_bytes = GROUP_BLOCK_BYTES[qtype]
    f = IRFunction(f"void @repack_{qtype.name.lower()}(ptr noalias %src, ptr noalias %dst, "
                   f"i64 %row_bytes, i64 %nb, i64 %g0, i64 %g1)")

    def group(g: str) -> None:
        rows = f.gep("%src", f.mul(f.mul(g, ROWS), "%row_bytes"))
        out = f.gep("%dst", f.mul(f.mul(g, "%nb"), out_bytes))

        def one(b: str, _: list[str]) -> list[str]:
            at = f.mul(b, block_bytes)
            src = [f.gep(rows, f.add(f.mul("%row_bytes", r), at)) for r in range(ROWS)]
            block(f, src, f.gep(out, f.mul(b, out_bytes)))
            return []

        f.loop("%nb", [], one)

    f.loop_range("%g0", "%g1", group)
    f.do("ret void")
    return f.text()


class CompiledRepack:
    """The compiled repack functions for the types that have one (compiled or cache-loaded)."""

    def __init__(self, qtypes: tuple[T, ...] = COMPILED) -> None:
        self._fns: dict[T, Callable[..., None]] = {}
        for q in qtypes:
            lib = jit.compile_cached("repack", (q.name,), functools.partial(build_repack_ir, q))
            self._fns[q] = lib.function(f"repack_{q.name.lower()}", None, _PTR, _PTR, _I64,
                                        _I64, _I64, _I64)

    def has(self, qtype: T) -> bool:
        return qtype in self._fns

    def into(self, w: QuantMatrix, dst: np.ndarray) -> None:
        """dst (uint8, the repacked size) = w repacked, engine.formats.repack's layout."""
        nb = w.raw.shape[1] // _BLOCKS[w.qtype][0]
        assert dst.nbytes == w.n_rows // ROWS * nb * GROUP_BLOCK_BYTES[w.qtype]
        self._fns[w.qtype](w.address, int(dst.ctypes.data), w.raw.shape[1], nb, 0, w.n_rows // ROWS)
