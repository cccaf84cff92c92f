"""Textual IR constants: vectors, splats, shuffle masks, byte literals, and the vector type names
the kernels spell most."""
from __future__ import annotations

from collections.abc import Iterable

V8F = "<8 x float>"
V16F, V16I = "<16 x float>", "<16 x i32>"


def vec_const(elem: str, values: Iterable[int | float | str]) -> str:
    """A constant vector: <i8 1, i8 2, ...>."""
    return "<" + ", ".join(f"{elem} {v}" for v in values) + ">"


def splat_const(elem: str, n: int, value: int | float | str) -> str:
    return vec_const(elem, [value] * n)


def shuffle_mask(indices: Iterable[int]) -> str:
    """A typed shufflevector mask: <n x i32> <i32 a, ...>."""
    idx = list(indices)
    return f"<{len(idx)} x i32> " + vec_const("i32", idx)


def i8_const(v: int) -> int:
    """An unsigned byte constant (0..255, or already -128..127) as the signed i8 literal LLVM
    expects."""
    return v - 256 if v > 127 else v


def bytes_const(values: Iterable[int]) -> str:
    """A <n x i8> constant of these byte values (0..255 or -128..127)."""
    return vec_const("i8", [i8_const(v) for v in values])


def splat_i8(n: int, v: int) -> str:
    return bytes_const([v] * n)


def i32x16(v: int) -> str:
    """A <16 x i32> constant splat."""
    return splat_const("i32", 16, v)
