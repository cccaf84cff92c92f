"""IR building blocks for the llvmlite-built kernels (ops.py, attention.py, builders' tasks).

Counted loops, <8 x float> loads and stores, a vector exp and tanh, horizontal reductions, and
the address of a numpy array. Kernels use explicit <8 x float> vectors plus a scalar tail rather
than the loop vectorizer, because the vectorizer gives up on the in-place calls (out is x) that
the forward pass makes.
"""
from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from llvmlite import ir

F32 = ir.FloatType()
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VEC = 8  # lanes: one AVX2 register of floats; LLVM splits it in two on SSE-only hosts
V8F32 = ir.VectorType(F32, VEC)
F64 = ir.DoubleType()
V8F64 = ir.VectorType(F64, VEC)
F32P = F32.as_pointer()


def new_module(name: str) -> ir.Module:
    return ir.Module(name=name)


def const(ty: ir.Type, value: float | int) -> ir.Constant:
    """A scalar constant, or the splat of `value` when `ty` is a vector type."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count)
    return ir.Constant(ty, value)


def i64(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def int_like(ty: ir.Type) -> ir.Type:
    """i32 or <n x i32> with the shape of the float type `ty`."""
    return ir.VectorType(I32, ty.count) if isinstance(ty, ir.VectorType) else I32


def _suffix(ty: ir.Type) -> str:
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    return {"float": "f32", "double": "f64", "i32": "i32", "i64": "i64"}[str(ty)]


def intrinsic(b: ir.IRBuilder, name: str, ty: ir.Type, n_args: int) -> ir.Function:
    """Declare (once) an overloaded intrinsic such as llvm.fmuladd on `ty`."""
    module = b.module
    full = f"{name}.{_suffix(ty)}"
    fn = module.globals.get(full)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ty, [ty] * n_args), name=full)
    return fn


def fmuladd(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x*y + z, fused where the target has FMA (llvm.fmuladd never becomes a libcall)."""
    return b.call(intrinsic(b, "llvm.fmuladd", x.type, 3), [x, y, z])


def maxnum(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.call(intrinsic(b, "llvm.maxnum", x.type, 2), [x, y])


def minnum(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.call(intrinsic(b, "llvm.minnum", x.type, 2), [x, y])


def splat(b: ir.IRBuilder, scalar: ir.Value, n: int = VEC) -> ir.Value:
    vty = ir.VectorType(scalar.type, n)
    one = b.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(I32, n), [0] * n))


def shuffle(b: ir.IRBuilder, x: ir.Value, y: ir.Value, lanes: list[int]) -> ir.Value:
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, len(lanes)), lanes))


def hsum(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Sum of the lanes of an 8-lane float or double vector, by halving (a fixed tree)."""
    lo = shuffle(b, v, v, [0, 1, 2, 3])
    hi = shuffle(b, v, v, [4, 5, 6, 7])
    s4 = b.fadd(lo, hi)
    s2 = b.fadd(shuffle(b, s4, s4, [0, 1]), shuffle(b, s4, s4, [2, 3]))
    return b.fadd(b.extract_element(s2, ir.Constant(I32, 0)), b.extract_element(s2, ir.Constant(I32, 1)))


def hmax(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Largest lane of a <8 x float> or <4 x float>."""
    while v.type.count > 1:
        half = v.type.count // 2
        v = maxnum(b, shuffle(b, v, v, list(range(half))), shuffle(b, v, v, list(range(half, 2 * half))))
    return b.extract_element(v, ir.Constant(I32, 0))


def hsum4x8(b: ir.IRBuilder, a: list[ir.Value]) -> ir.Value:
    """[sum(a[0]), sum(a[1]), sum(a[2]), sum(a[3])] as <4 x float>: 3 adds for four reductions."""
    u = b.fadd(shuffle(b, a[0], a[1], [0, 1, 2, 3, 8, 9, 10, 11]), shuffle(b, a[0], a[1], [4, 5, 6, 7, 12, 13, 14, 15]))
    v = b.fadd(shuffle(b, a[2], a[3], [0, 1, 2, 3, 8, 9, 10, 11]), shuffle(b, a[2], a[3], [4, 5, 6, 7, 12, 13, 14, 15]))
    # u = [a0 4 partials | a1 4 partials], v likewise for a2, a3
    w = b.fadd(shuffle(b, u, v, [0, 1, 4, 5, 8, 9, 12, 13]), shuffle(b, u, v, [2, 3, 6, 7, 10, 11, 14, 15]))
    # w = [a0 a0 a1 a1 a2 a2 a3 a3] partials
    return b.fadd(shuffle(b, w, w, [0, 2, 4, 6]), shuffle(b, w, w, [1, 3, 5, 7]))


def gep(b: ir.IRBuilder, ptr: ir.Value, index: ir.Value) -> ir.Value:
    return b.gep(ptr, [index], inbounds=True)


def load(b: ir.IRBuilder, base: ir.Value, index: ir.Value, ty: ir.Type = F32) -> ir.Value:
    """Load a scalar or an (unaligned) vector of floats starting at base[index]."""
    ptr = gep(b, base, index)
    if isinstance(ty, ir.VectorType):
        ptr = b.bitcast(ptr, ty.as_pointer())
    return b.load(ptr, align=4)


def store(b: ir.IRBuilder, value: ir.Value, base: ir.Value, index: ir.Value) -> None:
    ptr = gep(b, base, index)
    if isinstance(value.type, ir.VectorType):
        ptr = b.bitcast(ptr, value.type.as_pointer())
    b.store(value, ptr, align=4)


def variable(b: ir.IRBuilder, ty: ir.Type, init: ir.Value, name: str = "") -> ir.Value:
    """A stack slot (entry-block alloca, promoted to a register by mem2reg) set to `init` here."""
    here = b.block
    b.position_at_start(b.function.entry_basic_block)
    slot = b.alloca(ty, name=name)
    b.position_at_end(here)
    b.store(init, slot)
    return slot


@contextmanager
def counted_loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int = 1,
                 name: str = "i") -> Iterator[ir.Value]:
    """for (i = start; i < stop; i += step) { <body emitted inside the with-block> }"""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", i, stop), body, done)
    b.position_at_end(body)
    yield i
    i.add_incoming(b.add(i, i64(step)), b.block)
    b.branch(head)
    b.position_at_end(done)


def round_down(b: ir.IRBuilder, n: ir.Value, multiple: int) -> ir.Value:
    return b.and_(n, i64(-multiple))


def elementwise(b: ir.IRBuilder, n: ir.Value, body: Callable[[ir.Value, ir.Type], None]) -> None:
    """Call body(index, ty) over [0, n): <8 x float> steps, then a scalar tail."""
    n_vec = round_down(b, n, VEC)
    with counted_loop(b, i64(0), n_vec, VEC, "j") as j:
        body(j, V8F32)
    with counted_loop(b, n_vec, n, 1, "jt") as j:
        body(j, F32)


_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375          # ln 2 split so that n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = -2.12194440054690583e-4
_ROUND_MAGIC = 12582912.0      # 1.5 * 2^23: adding it rounds a float (|x| < 2^22) to an integer
_EXP_MIN = -87.0               # below this e^x is subnormal: we return 0 instead
_EXP_MAX = 88.0                # above this e^x overflows float: we return e^88


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x for a float or a float vector, relative error ~2e-7, without libm (vectorizes, no libcall).

    e^x = 2^n * e^r with n = round(x / ln 2), |r| <= ln2/2, e^r by its Taylor series to r^7.
    Inputs below -87 give 0, above 88 give e^88, NaN stays NaN.
    """
    ty = x.type
    xc = minnum(b, maxnum(b, x, const(ty, _EXP_MIN)), const(ty, _EXP_MAX))
    n = b.fsub(fmuladd(b, xc, const(ty, _LOG2E), const(ty, _ROUND_MAGIC)), const(ty, _ROUND_MAGIC))
    r = fmuladd(b, n, const(ty, -_LN2_HI), xc)
    r = fmuladd(b, n, const(ty, -_LN2_LO), r)
    p = const(ty, 1.0 / math.factorial(7))
    for k in range(6, -1, -1):
        p = fmuladd(b, p, r, const(ty, 1.0 / math.factorial(k)))
    ity = int_like(ty)
    two_n = b.bitcast(b.shl(b.add(b.fptosi(n, ity), const(ity, 127)), const(ity, 23)), ty)
    y = b.fmul(p, two_n)
    y = b.select(b.fcmp_ordered("<", x, const(ty, _EXP_MIN)), const(ty, 0.0), y)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh(x) = 1 - 2 / (e^(2x) + 1): exp's clamps saturate it cleanly at +-1; absolute error
    ~2e-7 (relative error grows near 0, where the callers' later scaling keeps it harmless)."""
    ty = x.type
    e = exp(b, b.fmul(x, const(ty, 2.0)))
    return b.fsub(const(ty, 1.0), b.fdiv(const(ty, 2.0), b.fadd(e, const(ty, 1.0))))


def sqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.call(intrinsic(b, "llvm.sqrt", x.type, 1), [x])


def define(module: ir.Module, name: str, ret: ir.Type, args: list[tuple[str, ir.Type]]) -> tuple[ir.IRBuilder, list[ir.Value]]:
    """Start a function; returns a builder in its entry block and its named arguments."""
    fn = ir.Function(module, ir.FunctionType(ret, [t for _, t in args]), name=name)
    for arg, (arg_name, _) in zip(fn.args, args):
        arg.name = arg_name
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return b, list(fn.args)


def address(a: np.ndarray) -> int:
    """Address of a C-contiguous array's data; ~0.2 us on the writable arrays we usually get."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]  # numpy's stubs lack Buffer
    except (TypeError, ValueError, BufferError):  # read-only or empty
        return a.ctypes.data
