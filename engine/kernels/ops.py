"""The small per-token glue of a llama forward pass, compiled, each with a numpy twin.

    rms_norm(x, weight, eps)        x / sqrt(mean(x^2) + eps) * weight, per row
    rope, rope_neox                 the rotary embedding's rotation, llama.cpp's normal mode
                                    (adjacent pairs) and NEOX mode (halves); engine.kernels.rotary
                                    holds the tables and the Python-side call
    silu_mul(gate, up)              silu(gate) * up, elementwise
    gelu_mul(gate, up)              gelu_tanh(gate) * up, elementwise (gemma's FFN)
    add_bias(x, bias)               x + bias, per row (qwen2's q/k/v biases)
    add(x, y)                       x + y, elementwise (gemma4's per-layer inputs and residual)
    softcap(x, cap)                 cap * tanh(x / cap), elementwise (gemma 2's final logits)
    scale(x, c)                     x * c, elementwise (gemma scales q before q . k)
    softmax(x)                      over the last axis, max-subtracted

Why compiled: numpy spends 1-4 us per call on these tiny rows (several passes, temporaries),
and a decode step makes ~150 such calls; one compiled pass costs about one ctypes call.
The `*_reference` twins compute in float64 and are what the tests trust.

The IR building blocks these kernels share with attention.py live in engine.kernels.ir.builder.
"""
from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from engine.kernels.ir.builder import (
    F32,
    F32P,
    F64,
    I64,
    V8F32,
    V8F64,
    VEC,
    address,
    const,
    counted_loop,
    define,
    elementwise,
    exp,
    fmuladd,
    gep,
    hmax,
    hsum,
    i64,
    load,
    maxnum,
    new_module,
    round_down,
    shuffle,
    splat,
    sqrt,
    store,
    tanh,
    variable,
)
from engine.kernels.jit import CompiledLibrary, compile_cached

# ---------------------------------------------------------------------------------------------
# The glue kernels
# ---------------------------------------------------------------------------------------------

def _build_rms_norm(module: ir.Module) -> None:
    # void rms_norm(float* x [M, n], float* w [n], float* out [M, n], i64 M, i64 n, float eps)
    b, (x, w, out, n_rows, n, eps) = define(module, "rms_norm", ir.VoidType(), [
        ("x", F32P), ("w", F32P), ("out", F32P), ("n_rows", I64), ("n", I64), ("eps", F32)])
    with counted_loop(b, i64(0), n_rows, 1, "m") as m:
        row = gep(b, x, b.mul(m, n))
        orow = gep(b, out, b.mul(m, n))
        acc_v = variable(b, V8F64, const(V8F64, 0.0), "ssv")  # double sums, as llama.cpp
        acc_s = variable(b, F64, const(F64, 0.0), "sss")

        def square_sum(j: ir.Value, ty: ir.Type) -> None:
            v = load(b, row, j, ty)
            slot = acc_v if ty is V8F32 else acc_s
            b.store(b.fadd(b.load(slot), b.fpext(b.fmul(v, v), slot.type.pointee)), slot)

        elementwise(b, n, square_sum)
        ss = b.fadd(hsum(b, b.load(acc_v)), b.load(acc_s))
        mean = b.fptrunc(b.fdiv(ss, b.sitofp(n, F64)), F32)
        scale = b.fdiv(const(F32, 1.0), sqrt(b, b.fadd(mean, eps)))

        def normalize(j: ir.Value, ty: ir.Type) -> None:
            s = splat(b, scale) if ty is V8F32 else scale
            store(b, b.fmul(b.fmul(load(b, row, j, ty), s), load(b, w, j, ty)), orow, j)

        elementwise(b, n, normalize)
    b.ret_void()


RotateHead = Callable[[ir.IRBuilder, ir.Value, ir.Value, ir.Value, ir.Value, ir.Value], None]


def _define_rope(module: ir.Module, name: str, rotate_head: RotateHead) -> None:
    """rope's and rope_neox's shared frame:
    i64 NAME(float* x [M, n_heads, head_dim], float* out (same), i64* pos [M], i64 M,
             i64 n_heads, i64 head_dim, i64 half_rot, float* cos [n_table, half_rot],
             float* sin [n_table, half_rot], i64 n_table) -> 0, or 1 + first row whose
    position is outside the table (then nothing was written). Per row and head,
    rotate_head(b, x_head, out_head, cos_row, sin_row, half_rot) rotates the first 2 * half_rot
    dims; the dims past them are copied unchanged."""
    b, (x, out, pos, n_rows, n_heads, head_dim, half_rot, cos, sin, n_table) = define(
        module, name, I64, [("x", F32P), ("out", F32P), ("pos", I64.as_pointer()), ("n_rows", I64),
                            ("n_heads", I64), ("head_dim", I64), ("half_rot", I64),
                            ("cos", F32P), ("sin", F32P), ("n_table", I64)])
    with counted_loop(b, i64(0), n_rows, 1, "chk") as m:
        p = b.load(gep(b, pos, m))
        with b.if_then(b.icmp_unsigned(">=", p, n_table), likely=False):  # also catches p < 0
            b.ret(b.add(m, i64(1)))
    with counted_loop(b, i64(0), n_rows, 1, "m") as m:
        p = b.load(gep(b, pos, m))
        c_row = gep(b, cos, b.mul(p, half_rot))
        s_row = gep(b, sin, b.mul(p, half_rot))
        with counted_loop(b, i64(0), n_heads, 1, "h") as h:
            base = b.mul(b.add(b.mul(m, n_heads), h), head_dim)
            xh, oh = gep(b, x, base), gep(b, out, base)
            rotate_head(b, xh, oh, c_row, s_row, half_rot)
            with counted_loop(b, b.shl(half_rot, i64(1)), head_dim, 1, "pass") as j:
                store(b, load(b, xh, j), oh, j)  # dims past n_rot: unchanged
    b.ret(i64(0))


def _rotate_adjacent(b: ir.IRBuilder, xh: ir.Value, oh: ir.Value, c_row: ir.Value,
                     s_row: ir.Value, half_rot: ir.Value) -> None:
    """NORM rope (llama): pair i is (x[2i], x[2i + 1])."""
    n_rot = b.shl(half_rot, i64(1))
    # 8 floats = 4 pairs per step: de-interleave, rotate, re-interleave
    with counted_loop(b, i64(0), round_down(b, n_rot, VEC), VEC, "v") as j:
        lo = load(b, xh, j, V8F32)
        evens = shuffle(b, lo, lo, [0, 2, 4, 6])
        odds = shuffle(b, lo, lo, [1, 3, 5, 7])
        k = b.lshr(j, i64(1))
        c4 = load(b, c_row, k, ir.VectorType(F32, 4))
        s4 = load(b, s_row, k, ir.VectorType(F32, 4))
        r0 = b.fsub(b.fmul(evens, c4), b.fmul(odds, s4))
        r1 = fmuladd(b, evens, s4, b.fmul(odds, c4))
        store(b, shuffle(b, r0, r1, [0, 4, 1, 5, 2, 6, 3, 7]), oh, j)
    with counted_loop(b, b.lshr(round_down(b, n_rot, VEC), i64(1)), half_rot, 1, "pt") as k:
        j = b.shl(k, i64(1))
        j1 = b.add(j, i64(1))
        x0, x1 = load(b, xh, j), load(b, xh, j1)
        c, s = load(b, c_row, k), load(b, s_row, k)
        store(b, b.fsub(b.fmul(x0, c), b.fmul(x1, s)), oh, j)
        store(b, fmuladd(b, x0, s, b.fmul(x1, c)), oh, j1)


def _rotate_halves(b: ir.IRBuilder, x0h: ir.Value, o0h: ir.Value, c_row: ir.Value,
                   s_row: ir.Value, half_rot: ir.Value) -> None:
    """NEOX rope (qwen, gemma, phi3): pair i is (x[i], x[i + half_rot])."""
    x1h, o1h = gep(b, x0h, half_rot), gep(b, o0h, half_rot)

    def pair(k: ir.Value, ty: ir.Type) -> None:
        x0, x1 = load(b, x0h, k, ty), load(b, x1h, k, ty)
        c, s = load(b, c_row, k, ty), load(b, s_row, k, ty)
        store(b, b.fsub(b.fmul(x0, c), b.fmul(x1, s)), o0h, k)
        store(b, fmuladd(b, x0, s, b.fmul(x1, c)), o1h, k)

    elementwise(b, half_rot, pair)


def _build_rope(module: ir.Module) -> None:
    _define_rope(module, "rope", _rotate_adjacent)


def _build_rope_neox(module: ir.Module) -> None:
    _define_rope(module, "rope_neox", _rotate_halves)


def round_f16(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x rounded to f16's 11 significant bits, kept as float (Veltkamp's split). Exact for
    values in f16's normal range; f16 subnormals keep a few bits too many (|x| < 6e-5)."""
    t = b.fmul(x, const(x.type, float(2 ** 13 + 1)))
    return b.fsub(t, b.fsub(t, x))


def _build_gelu_mul(module: ir.Module) -> None:
    # void gelu_mul(float* gate [n], float* up [n], float* out [n], i64 n): gelu_tanh(g) * u the
    # way ggml computes it (GGML_GELU_FP16): for -10 < g < 10 a table of f16 results indexed by
    # f16(g), so f16(gelu(f16(g))); 0 at or below -10, g at or above 10.
    # gelu_tanh(g) = 0.5 g (1 + tanh(y)) = g / (1 + e^(-2y)), y = sqrt(2/pi) (g + 0.044715 g^3):
    # the sigmoid form has no cancellation where tanh ~ -1.
    b, (gate, up, out, n) = define(module, "gelu_mul", ir.VoidType(), [
        ("gate", F32P), ("up", F32P), ("out", F32P), ("n", I64)])

    def body(j: ir.Value, ty: ir.Type) -> None:
        g0 = load(b, gate, j, ty)
        g = round_f16(b, g0)
        inner = b.fmul(g, fmuladd(b, b.fmul(g, g), const(ty, 0.044715), const(ty, 1.0)))
        e = exp(b, b.fmul(inner, const(ty, -2.0 * math.sqrt(2.0 / math.pi))))
        gelu = round_f16(b, b.fdiv(g, b.fadd(const(ty, 1.0), e)))
        gelu = b.select(b.fcmp_ordered("<=", g0, const(ty, -10.0)), const(ty, 0.0), gelu)
        gelu = b.select(b.fcmp_ordered(">=", g0, const(ty, 10.0)), g0, gelu)
        store(b, b.fmul(gelu, load(b, up, j, ty)), out, j)

    elementwise(b, n, body)
    b.ret_void()


def _build_add_bias(module: ir.Module) -> None:
    # void add_bias(float* x [M, n], float* bias [n], float* out [M, n], i64 M, i64 n)
    b, (x, bias, out, n_rows, n) = define(module, "add_bias", ir.VoidType(), [
        ("x", F32P), ("bias", F32P), ("out", F32P), ("n_rows", I64), ("n", I64)])
    with counted_loop(b, i64(0), n_rows, 1, "m") as m:
        row, orow = gep(b, x, b.mul(m, n)), gep(b, out, b.mul(m, n))

        def body(j: ir.Value, ty: ir.Type) -> None:
            store(b, b.fadd(load(b, row, j, ty), load(b, bias, j, ty)), orow, j)

        elementwise(b, n, body)
    b.ret_void()


def _build_add(module: ir.Module) -> None:
    # void add(float* x [n], float* y [n], float* out [n], i64 n): the gated ops' signature, so
    # the GLU task runs it over rows
    b, (x, y, out, n) = define(module, "add", ir.VoidType(), [
        ("x", F32P), ("y", F32P), ("out", F32P), ("n", I64)])

    def body(j: ir.Value, ty: ir.Type) -> None:
        store(b, b.fadd(load(b, x, j, ty), load(b, y, j, ty)), out, j)

    elementwise(b, n, body)
    b.ret_void()


def _build_scalar_op(module: ir.Module, name: str,
                     fn: Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]) -> None:
    # void name(float* x [n], float* out [n], i64 n, float c): out = fn(x, c), elementwise
    b, (x, out, n, c) = define(module, name, ir.VoidType(), [
        ("x", F32P), ("out", F32P), ("n", I64), ("c", F32)])

    def body(j: ir.Value, ty: ir.Type) -> None:
        store(b, fn(b, load(b, x, j, ty), splat(b, c) if ty is V8F32 else c), out, j)

    elementwise(b, n, body)
    b.ret_void()


def _build_softcap(module: ir.Module) -> None:
    # softcap(x, out, n, cap): cap * tanh(x / cap)
    _build_scalar_op(module, "softcap", lambda b, v, cap: b.fmul(cap, tanh(b, b.fdiv(v, cap))))


def _build_scale(module: ir.Module) -> None:
    # scale(x, out, n, c): x * c
    _build_scalar_op(module, "scale", lambda b, v, c: b.fmul(v, c))


def _build_silu_mul(module: ir.Module) -> None:
    # void silu_mul(float* gate [n], float* up [n], float* out [n], i64 n)
    b, (gate, up, out, n) = define(module, "silu_mul", ir.VoidType(), [
        ("gate", F32P), ("up", F32P), ("out", F32P), ("n", I64)])

    def body(j: ir.Value, ty: ir.Type) -> None:
        g = load(b, gate, j, ty)
        sig = b.fdiv(const(ty, 1.0), b.fadd(const(ty, 1.0), exp(b, b.fneg(g))))
        store(b, b.fmul(b.fmul(g, sig), load(b, up, j, ty)), out, j)

    elementwise(b, n, body)
    b.ret_void()


def _build_softmax(module: ir.Module) -> None:
    # void softmax(float* x [M, n], float* out [M, n], i64 M, i64 n)
    b, (x, out, n_rows, n) = define(module, "softmax", ir.VoidType(), [
        ("x", F32P), ("out", F32P), ("n_rows", I64), ("n", I64)])
    with counted_loop(b, i64(0), n_rows, 1, "m") as m:
        row = gep(b, x, b.mul(m, n))
        orow = gep(b, out, b.mul(m, n))
        max_v = variable(b, V8F32, const(V8F32, -math.inf), "maxv")
        max_s = variable(b, F32, const(F32, -math.inf), "maxs")

        def row_max(j: ir.Value, ty: ir.Type) -> None:
            slot = max_v if ty is V8F32 else max_s
            b.store(maxnum(b, b.load(slot), load(b, row, j, ty)), slot)

        elementwise(b, n, row_max)
        mx = maxnum(b, hmax(b, b.load(max_v)), b.load(max_s))
        sum_v = variable(b, V8F64, const(V8F64, 0.0), "sumv")  # vocab-long rows: sum in double
        sum_s = variable(b, F64, const(F64, 0.0), "sums")

        def exponentiate(j: ir.Value, ty: ir.Type) -> None:
            e = exp(b, b.fsub(load(b, row, j, ty), splat(b, mx) if ty is V8F32 else mx))
            store(b, e, orow, j)
            slot = sum_v if ty is V8F32 else sum_s
            b.store(b.fadd(b.load(slot), b.fpext(e, slot.type.pointee)), slot)

        elementwise(b, n, exponentiate)
        total = b.fadd(hsum(b, b.load(sum_v)), b.load(sum_s))
        inv = b.fptrunc(b.fdiv(const(F64, 1.0), total), F32)

        def normalize(j: ir.Value, ty: ir.Type) -> None:
            store(b, b.fmul(load(b, orow, j, ty), splat(b, inv) if ty is V8F32 else inv), orow, j)

        elementwise(b, n, normalize)
    b.ret_void()


def build_ops_module() -> ir.Module:
    module = new_module("ops")
    _build_rms_norm(module)
    _build_rope(module)
    _build_rope_neox(module)
    _build_silu_mul(module)
    _build_gelu_mul(module)
    _build_add_bias(module)
    _build_add(module)
    _build_softcap(module)
    _build_scale(module)
    _build_softmax(module)
    return module


class _Ops:
    """The compiled glue functions (ctypes handles), loaded once per process."""

    def __init__(self) -> None:
        lib: CompiledLibrary = compile_cached("ops", (), lambda: str(build_ops_module()))
        p, n, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        self.rms_norm = lib.function("rms_norm", None, p, p, p, n, n, f)
        self.rope = lib.function("rope", ctypes.c_int64, p, p, p, n, n, n, n, p, p, n)
        self.rope_neox = lib.function("rope_neox", ctypes.c_int64, p, p, p, n, n, n, n, p, p, n)
        self.silu_mul = lib.function("silu_mul", None, p, p, p, n)
        self.gelu_mul = lib.function("gelu_mul", None, p, p, p, n)
        self.add_bias = lib.function("add_bias", None, p, p, p, n, n)
        self.add = lib.function("add", None, p, p, p, n)
        self.softcap = lib.function("softcap", None, p, p, n, f)
        self.scale = lib.function("scale", None, p, p, n, f)
        self.softmax = lib.function("softmax", None, p, p, n, n)
        # addresses for task graphs (engine.kernels.tasks calls these through pointers)
        self.address = {name: lib.address(name) for name in (
            "rms_norm", "rope", "rope_neox", "silu_mul", "gelu_mul", "add_bias", "add", "scale")}


_ops: _Ops | None = None
_ops_lock = threading.Lock()


def load_ops() -> _Ops:
    """Compile (or load from the disk cache) the glue kernels; call at model load, not per request."""
    global _ops
    if _ops is None:
        with _ops_lock:
            if _ops is None:
                _ops = _Ops()
    return _ops


# ---------------------------------------------------------------------------------------------
# Facades: check arguments, call the kernel
# ---------------------------------------------------------------------------------------------

def check_f32(a: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise TypeError(f"{what} must be a C-contiguous float32 numpy array")
    return a


def out_like(out: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    if out is None:
        return np.empty_like(x)
    check_f32(out, "out")
    if out.shape != x.shape:
        raise ValueError(f"out has shape {out.shape}, expected {x.shape}")
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """x: [..., n] float32 -> x / sqrt(mean(x^2, -1) + eps) * weight. out may be x."""
    check_f32(x, "x")
    check_f32(weight, "weight")
    n = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or weight.shape != (n,):
        raise ValueError(f"weight shape {weight.shape} does not match x shape {x.shape}")
    out = out_like(out, x)
    if x.size:
        load_ops().rms_norm(address(x), address(weight), address(out), x.size // n, n, eps)
    return out


def rms_norm_reference(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * weight).astype(np.float32)


def _gated(name: str, gate: np.ndarray, up: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The compiled `name`(gate, up, out, count) over arrays of one shape."""
    check_f32(gate, "gate")
    check_f32(up, "up")
    if gate.shape != up.shape:
        raise ValueError(f"gate shape {gate.shape} != up shape {up.shape}")
    out = out_like(out, gate)
    if gate.size:
        getattr(load_ops(), name)(address(gate), address(up), address(out), gate.size)
    return out


def silu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """silu(gate) * up = gate / (1 + e^-gate) * up, elementwise; any shape. out may be gate or up."""
    return _gated("silu_mul", gate, up, out)


def silu_mul_reference(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    with np.errstate(over="ignore"):  # e^-g = inf for very negative g gives the right limit, 0
        return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


def gelu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """gelu_tanh(gate) * up, elementwise (the tanh approximation, as gemma uses), with ggml's
    f16 rounding of gelu's input and result (its table); any shape. out may be gate or up."""
    return _gated("gelu_mul", gate, up, out)


def gelu_tanh_reference(x: np.ndarray) -> np.ndarray:
    """gelu with the tanh approximation, float64."""
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_mul_reference(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """ggml's gelu (an f16 table over f16 inputs in (-10, 10)) times up."""
    g = gate.astype(np.float32)
    table = gelu_tanh_reference(g.astype(np.float16)).astype(np.float16).astype(np.float64)
    gelu = np.where(g <= -10, 0.0, np.where(g >= 10, g.astype(np.float64), table))
    return (gelu * up).astype(np.float32)


def add_bias(x: np.ndarray, bias: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x [..., n] + bias [n], per row. out may be x."""
    check_f32(x, "x")
    check_f32(bias, "bias")
    if x.ndim == 0 or bias.shape != (x.shape[-1],):
        raise ValueError(f"bias shape {bias.shape} does not match x shape {x.shape}")
    out = out_like(out, x)
    if x.size:
        n = x.shape[-1]
        load_ops().add_bias(address(x), address(bias), address(out), x.size // n, n)
    return out


def add(x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x + y as float32, elementwise; any shape (both the same). out may be x or y."""
    return _gated("add", x, y, out)


def add_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)


def softcap(x: np.ndarray, cap: float, out: np.ndarray | None = None) -> np.ndarray:
    """cap * tanh(x / cap), elementwise (cap > 0); any shape. out may be x."""
    check_f32(x, "x")
    if not cap > 0:
        raise ValueError(f"softcap must be > 0, got {cap}")
    out = out_like(out, x)
    if x.size:
        load_ops().softcap(address(x), address(out), x.size, cap)
    return out


def scale(x: np.ndarray, c: float, out: np.ndarray | None = None) -> np.ndarray:
    """x * c as float32, elementwise; any shape. out may be x."""
    check_f32(x, "x")
    out = out_like(out, x)
    if x.size:
        load_ops().scale(address(x), address(out), x.size, c)
    return out


def softcap_reference(x: np.ndarray, cap: float) -> np.ndarray:
    return (cap * np.tanh(x.astype(np.float64) / cap)).astype(np.float32)


def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis with max subtraction; -inf entries get probability 0. out may be x."""
    check_f32(x, "x")
    if x.ndim == 0:
        raise ValueError("softmax needs at least one axis")
    out = out_like(out, x)
    if x.size:
        n = x.shape[-1]
        load_ops().softmax(address(x), address(out), x.size // n, n)
    return out


def softmax_reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
