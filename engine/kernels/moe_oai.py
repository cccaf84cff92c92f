"""gpt-oss's mixture-of-experts variants, compiled, each with a numpy twin (beside engine.kernels.moe,
whose qwen3moe kernels stay as they are):

    route_topk(logits, k)         per token: the k largest logits (ties: the lower expert), their
                                  weights the softmax over those k alone (llama.cpp's
                                  SOFTMAX_WEIGHT gating; the router bias is added before, as a
                                  plain bias on the logits rows)
    swiglu_oai(gate, up)          x = min(gate, 7), y = clamp(up, -7, 7),
                                  x * sigmoid(1.702 x) * (y + 1)   (ggml's swiglu_oai)
    task_moe_bias                 each grouped row of an expert's run += that expert's bias
                                  (llama.cpp's add_id after mul_mat_id)

moe_route_topk has moe_route's signature and swiglu_oai silu_mul's, so the graph's route and GLU
tasks call them through their function pointers; task_moe_bias is a task of its own.
"""
from __future__ import annotations

import ctypes
import math
import threading

import numpy as np
from llvmlite import ir

from engine.kernels import jit
from engine.kernels.ir.builder import (
    F32,
    F32P,
    F64,
    I64,
    V8F32,
    address,
    const,
    counted_loop,
    define,
    elementwise,
    exp,
    gep,
    i64,
    load,
    maxnum,
    minnum,
    new_module,
    splat,
    store,
    variable,
)
from engine.kernels.ir.text import IRFunction
from engine.kernels.jit import CompiledLibrary, compile_cached
from engine.kernels.moe import take_top_k
from engine.kernels.tasks import STEP, Layout

I64P = I64.as_pointer()
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # llama.cpp's openai-moe constants


def _build_route_topk(module: ir.Module) -> None:
    # void moe_route_topk(float* logits [M, E] (overwritten), i64* ids [M, k], float* w [M, k],
    #                     i64 M, i64 E, i64 k)
    b, (logits, ids, w, n_rows, n_exp, k) = define(module, "moe_route_topk", ir.VoidType(), [
        ("logits", F32P), ("ids", I64P), ("w", F32P), ("n_rows", I64), ("n_exp", I64),
        ("k", I64)])
    best = variable(b, I64, i64(0), "best")
    best_l = variable(b, F32, const(F32, -math.inf), "best_l")
    total = variable(b, F64, const(F64, 0.0), "total")
    with counted_loop(b, i64(0), n_rows, 1, "m") as m:
        row = gep(b, logits, b.mul(m, n_exp))
        ids_row, w_row = gep(b, ids, b.mul(m, k)), gep(b, w, b.mul(m, k))
        take_top_k(b, row, n_exp, k, ids_row, w_row, best, best_l)
        mx = load(b, w_row, i64(0))  # the first chosen is the largest
        b.store(const(F64, 0.0), total)
        with counted_loop(b, i64(0), k, 1, "x") as j:  # ggml's soft_max: the sum in double
            p = exp(b, b.fsub(load(b, w_row, j), mx))
            store(b, p, w_row, j)
            b.store(b.fadd(b.load(total), b.fpext(p, F64)), total)
        inv = b.fptrunc(b.fdiv(const(F64, 1.0), b.load(total)), F32)
        with counted_loop(b, i64(0), k, 1, "n") as j:
            store(b, b.fmul(load(b, w_row, j), inv), w_row, j)
    b.ret_void()


def _build_swiglu_oai(module: ir.Module) -> None:
    # void swiglu_oai(float* gate [n], float* up [n], float* out [n], i64 n)
    b, (gate, up, out, n) = define(module, "swiglu_oai", ir.VoidType(), [
        ("gate", F32P), ("up", F32P), ("out", F32P), ("n", I64)])

    def body(j: ir.Value, ty: ir.Type) -> None:
        def c(v: float) -> ir.Value:
            return splat(b, const(F32, v)) if ty is V8F32 else const(F32, v)
        x = minnum(b, load(b, gate, j, ty), c(SWIGLU_LIMIT))
        y = maxnum(b, minnum(b, load(b, up, j, ty), c(SWIGLU_LIMIT)), c(-SWIGLU_LIMIT))
        glu = b.fdiv(x, b.fadd(c(1.0), exp(b, b.fmul(c(-SWIGLU_ALPHA), x))))
        store(b, b.fmul(glu, b.fadd(y, c(1.0))), out, j)

    elementwise(b, n, body)
    b.ret_void()


def build_moe_oai_module() -> ir.Module:
    module = new_module("moe_oai")
    _build_route_topk(module)
    _build_swiglu_oai(module)
    return module


EXPERT_BIAS = Layout((("fn", "ptr"), ("x", "ptr"), ("bias", "ptr"), ("n", "i64"),
                      ("offsets", "ptr"), ("n_expert", "i64"), ("k", "i64")))
_SIG = "(ptr noalias %args, ptr noalias %step, i64 %tid, i64 %nth)"


def build_expert_bias_task() -> str:
    """task_moe_bias: my grouped rows [p0, p1) of P = n_tokens * k; the part of each expert e's
    run among them += bias[e] through fn, ops' add_bias(x, bias, out, n_rows, n)."""
    f = IRFunction(f"void @task_moe_bias{_SIG}")
    a = EXPERT_BIAS.load(f, "%args")
    pairs = f.mul(f.load("i64", "%step", STEP.offset("n_tokens"), align=8), a["k"])
    p0 = f.let(f"udiv i64 {f.mul(pairs, '%tid')}, %nth")
    p1 = f.let(f"udiv i64 {f.mul(pairs, f.add('%tid', 1))}, %nth")

    def run(e: str) -> None:
        start = f.load("i64", a["offsets"], f.mul(e, 8), align=8)
        end = f.load("i64", a["offsets"], f.mul(f.add(e, 1), 8), align=8)
        lo = f.let(f"call i64 @llvm.smax.i64(i64 {p0}, i64 {start})")
        hi = f.let(f"call i64 @llvm.smin.i64(i64 {p1}, i64 {end})")

        def add() -> None:
            x = f.gep(a["x"], f.mul(f.mul(lo, a["n"]), 4))
            bias = f.gep(a["bias"], f.mul(f.mul(e, a["n"]), 4))
            f.do(f"call void {a['fn']}(ptr {x}, ptr {bias}, ptr {x}, "
                 f"i64 {f.let(f'sub i64 {hi}, {lo}')}, i64 {a['n']})")

        f.if_then(f.let(f"icmp slt i64 {lo}, {hi}"), add)

    f.each(a["n_expert"], run)
    f.do("ret void")
    return "\n".join(["declare i64 @llvm.smax.i64(i64, i64)",
                      "declare i64 @llvm.smin.i64(i64, i64)", f.text()])


class _MoeOai:
    """The compiled functions and the bias task (addresses for task graphs), loaded once."""

    def __init__(self) -> None:
        lib: CompiledLibrary = compile_cached("moe_oai", (), lambda: str(build_moe_oai_module()))
        p, n = ctypes.c_void_p, ctypes.c_int64
        self.route_topk = lib.function("moe_route_topk", None, p, p, p, n, n, n)
        self.swiglu_oai = lib.function("swiglu_oai", None, p, p, p, n)
        tasks = jit.compile_cached("moe_oai_tasks", (), build_expert_bias_task)
        self.address = {"moe_route_topk": lib.address("moe_route_topk"),
                        "swiglu_oai": lib.address("swiglu_oai"),
                        "task_moe_bias": tasks.address("task_moe_bias")}


_loaded: _MoeOai | None = None
_lock = threading.Lock()


def load_moe_oai() -> _MoeOai:
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _MoeOai()
        return _loaded


# ---------------------------------------------------------------------------------------------
# Facades (the eager path and the tests) and their numpy twins
# ---------------------------------------------------------------------------------------------

def route_topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 [T, E] router logits (bias included) -> (ids int64 [T, k], weights float32 [T, k])."""
    x = np.array(logits, dtype=np.float32, order="C")  # a copy: the kernel works in place
    n_tokens, n_exp = x.shape
    if not 0 < k <= n_exp:
        raise ValueError(f"cannot choose {k} of {n_exp} experts")
    ids = np.empty((n_tokens, k), np.int64)
    w = np.empty((n_tokens, k), np.float32)
    if n_tokens:
        load_moe_oai().route_topk(address(x), address(ids), address(w), n_tokens, n_exp, k)
    return ids, w


def route_topk_reference(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argsort(-logits.astype(np.float64), axis=-1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits.astype(np.float64), ids, axis=-1)
    p = np.exp(chosen - chosen.max(axis=-1, keepdims=True))
    return ids.astype(np.int64), (p / p.sum(axis=-1, keepdims=True)).astype(np.float32)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """float32 [..., n] elementwise (see the module docstring)."""
    g = np.ascontiguousarray(gate, dtype=np.float32)
    u = np.ascontiguousarray(up, dtype=np.float32)
    if g.shape != u.shape:
        raise ValueError(f"gate {g.shape} and up {u.shape} differ")
    out = np.empty_like(g)
    load_moe_oai().swiglu_oai(address(g), address(u), address(out), g.size)
    return out


def swiglu_oai_reference(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    x = np.minimum(gate.astype(np.float64), SWIGLU_LIMIT)
    y = np.clip(up.astype(np.float64), -SWIGLU_LIMIT, SWIGLU_LIMIT)
    return (x / (1.0 + np.exp(-SWIGLU_ALPHA * x)) * (y + 1.0)).astype(np.float32)
