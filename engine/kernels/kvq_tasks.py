"""The graph's tasks for a quantized KV cache (type_k / type_v q8_0 or q4_0, engine.kv_types):
the fused pass's K/V store and attention over rows of ggml blocks.

Same contract as engine.kernels.tasks, in a module of their own (an f16 model's tasks stay as
they were):

    task_rope_store_quantized   my token rows: rope q and k (tasks.rope_rows), then each cache
                                row (and a ring's mirror row) gets k and v quantized by the
                                row quantizers below, through pointers in ROPE_STORE_QUANTIZED
    task_attention_quantized    my attention segments (tasks.my_segments): the quantized kernel
                                (engine.kernels.attention_ir.quantized, one per head_dim) over
                                each chunk's slot rows, for every chunk size (llama.cpp's
                                quantized cache takes its one-row path at every batch size)

and the row quantizers, void kvq_quantize_<type>(ptr src f32 [n], ptr dst, i64 n), n % 32 == 0,
ggml's reference quantizers in float32 step for step, so they store the bytes the eager pass's
numpy quantizer (engine.kv_types.quantize_rows, their twin) does:

    q8_0   d = max|x| / 127, q = roundeven(x * (127 / max|x|)) (0 for a zero block), d as f16
    q4_0   m = the value of largest magnitude (the first one), d = m / -8, q = min(15,
           trunc(x * (1 / d) + 8.5)) (0 for a zero block), value j low nibble, j + 16 high
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from engine.kernels import jit
from engine.kernels.ir import q8
from engine.kernels.ir.text import IRFunction
from engine.kernels.tasks import ROPE_STORE, Layout, my_segments, rope_rows, store_rows

ROPE_STORE_QUANTIZED = Layout(ROPE_STORE.fields + (
    ("k_quantize", "ptr"), ("v_quantize", "ptr"),   # row quantizers (kvq_quantize_<type>)
    ("k_row_bytes", "i64"), ("v_row_bytes", "i64")))  # bytes of a cache row (all kv heads)
ATTENTION_QUANTIZED = Layout((
    ("fn", "ptr"), ("q", "ptr"), ("k_cache", "ptr"), ("v_cache", "ptr"), ("out", "ptr"),
    ("scratch", "ptr"), ("scratch_bytes", "i64"), ("n_head", "i64"), ("n_kv_head", "i64"),
    ("head_dim", "i64"), ("scale", "float"), ("group", "i64"), ("window", "i64"), ("ring", "i64"),
    ("k_row_bytes", "i64"), ("v_row_bytes", "i64")))

_SIG = "(ptr noalias %args, ptr noalias %step, i64 %tid, i64 %nth)"
_QSIG = "(ptr noalias %src, ptr noalias %dst, i64 %n)"


def _quantize_q8_0() -> str:
    f = IRFunction(f"void @kvq_quantize_q8_0{_QSIG}")

    def block(i: str) -> None:
        src = f.gep("%src", f.mul(i, 128))
        dst = f.gep("%dst", f.mul(i, 34))
        amax = q8.absmax(f, src, 1)
        nonzero = f.let(f"fcmp one float {amax}, 0.0")
        inv = f.select(nonzero, "float", f.let(f"fdiv float 127.0, {amax}"), "0.0")
        d = f.let(f"fdiv float {amax}, 127.0")
        f.store("half", f.let(f"fptrunc float {d} to half"), dst)
        q8.quantize_chunk(f, src, f.gep(dst, 2), inv)

    f.each(f.let("udiv i64 %n, 32"), block)
    f.do("ret void")
    return f.text()


def _quantize_q4_0() -> str:
    f = IRFunction(f"void @kvq_quantize_q4_0{_QSIG}")

    def block(i: str) -> None:
        src = f.gep("%src", f.mul(i, 128))
        dst = f.gep("%dst", f.mul(i, 18))

        def scan(j: str, carried: list[str]) -> list[str]:  # the first value of largest |x|
            amax, m = carried
            x = f.load("float", src, f.mul(j, 4))
            ax = f.let(f"call float @llvm.fabs.f32(float {x})")
            bigger = f.let(f"fcmp ogt float {ax}, {amax}")
            return [f.select(bigger, "float", ax, amax), f.select(bigger, "float", x, m)]

        _, m = f.loop("32", [("float", "0.0"), ("float", "0.0")], scan)
        d = f.let(f"fdiv float {m}, -8.0")
        nonzero = f.let(f"fcmp one float {d}, 0.0")
        inv = f.select(nonzero, "float", f.let(f"fdiv float 1.0, {d}"), "0.0")
        f.store("half", f.let(f"fptrunc float {d} to half"), dst)
        halves = []
        for h in range(2):
            x = f.load("<16 x float>", src, 64 * h)
            y = f.let(f"fmul <16 x float> {x}, {f.splat_float(inv, 16)}")
            y = f.let(f"fadd <16 x float> {y}, {_splat16('8.5')}")
            t = f.let(f"fptosi <16 x float> {y} to <16 x i32>")
            big = f.let(f"icmp sgt <16 x i32> {t}, {_splat16('15', 'i32')}")
            t = f.let(f"select <16 x i1> {big}, <16 x i32> {_splat16('15', 'i32')}, <16 x i32> {t}")
            halves.append(f.let(f"trunc <16 x i32> {t} to <16 x i8>"))
        high = f.let(f"shl <16 x i8> {halves[1]}, {_splat16('4', 'i8')}")
        f.store("<16 x i8>", f.let(f"or <16 x i8> {halves[0]}, {high}"), dst, 2)

    f.each(f.let("udiv i64 %n, 32"), block)
    f.do("ret void")
    return f.text()


def _splat16(value: str, elem: str = "float") -> str:
    return "<" + ", ".join([f"{elem} {value}"] * 16) + ">"


def _task_rope_store_quantized() -> str:
    """My token rows t: rope q[t], k[t]; then each of t's cache rows gets k_quantize(k[t]) and
    v_quantize(v[t]) (a row of all kv heads: whole blocks per head, so one call per row)."""
    f = IRFunction(f"void @task_rope_store_quantized{_SIG}")
    a = ROPE_STORE_QUANTIZED.load(f, "%args")
    r0, r1, kv_rows, mirror = rope_rows(f, a)
    kv_dim = f.mul(a["n_kv_head"], a["head_dim"])
    kv_row = f.mul(kv_dim, 4)

    def to_row(t: str, row: str) -> None:
        for x, cache, quantize, row_bytes in (("k", "k_cache", "k_quantize", "k_row_bytes"),
                                              ("v", "v_cache", "v_quantize", "v_row_bytes")):
            src = f.gep(a[x], f.mul(t, kv_row))
            dst = f.gep(a[cache], f.mul(row, a[row_bytes]))
            f.do(f"call void {a[quantize]}(ptr {src}, ptr {dst}, i64 {kv_dim})")

    store_rows(f, r0, r1, kv_rows, mirror, to_row)
    f.do("ret void")
    return f.text()


def _task_attention_quantized() -> str:
    """My segments (chunk c, items [w0, w1)): fn over chunk c's queries and its slot's rows."""
    f = IRFunction(f"void @task_attention_quantized{_SIG}")
    a = ATTENTION_QUANTIZED.load(f, "%args")
    q_row = f.mul(f.mul(a["n_head"], a["head_dim"]), 4)
    scratch = f.gep(a["scratch"], f.mul("%tid", a["scratch_bytes"]))

    def segment(c: str, w0: str, w1: str, row0: str, n_q: str, pos0: str, kv0: str) -> None:
        q = f.gep(a["q"], f.mul(row0, q_row))
        out = f.gep(a["out"], f.mul(row0, q_row))
        k = f.gep(a["k_cache"], f.mul(kv0, a["k_row_bytes"]))
        v = f.gep(a["v_cache"], f.mul(kv0, a["v_row_bytes"]))
        f.do(f"call void {a['fn']}(ptr {q}, ptr {k}, ptr {v}, ptr {out}, ptr {scratch}, "
             f"i64 {n_q}, i64 {a['n_head']}, i64 {a['n_kv_head']}, i64 {a['head_dim']}, "
             f"i64 {pos0}, float {a['scale']}, i64 {w0}, i64 {w1}, i64 {a['window']}, "
             f"i64 {a['ring']})")

    my_segments(f, a["group"], segment)
    f.do("ret void")
    return f.text()


def build_kvq_tasks_ir() -> str:
    declares = ("declare float @llvm.fabs.f32(float)\n"
                "declare <32 x float> @llvm.fabs.v32f32(<32 x float>)\n"
                "declare float @llvm.vector.reduce.fmax.v32f32(<32 x float>)\n"
                "declare float @llvm.maxnum.f32(float, float)\n"
                "declare <32 x float> @llvm.roundeven.v32f32(<32 x float>)\n")
    return declares + "\n".join([_quantize_q8_0(), _quantize_q4_0(), _task_rope_store_quantized(),
                                 _task_attention_quantized()])


class KVQTasks:
    """Addresses of the quantized cache's tasks and row quantizers (compiled once a process)."""

    def __init__(self) -> None:
        lib = jit.compile_cached("kvq_tasks", (), build_kvq_tasks_ir)
        self.address = {name: lib.address(name) for name in (
            "task_rope_store_quantized", "task_attention_quantized", "kvq_quantize_q8_0",
            "kvq_quantize_q4_0")}
        p, n = ctypes.c_void_p, ctypes.c_int64
        self._quantize = {t: lib.function(f"kvq_quantize_{t}", None, p, p, n) for t in ("q8_0", "q4_0")}

    def quantizer(self, type_name: str) -> int:
        """The address of the row quantizer of a quantized KV type."""
        return self.address[f"kvq_quantize_{type_name}"]

    def quantize(self, x: np.ndarray, type_name: str, row_bytes: int) -> np.ndarray:
        """float32 [n] (n % 32 == 0) -> uint8 [row_bytes] through the compiled quantizer (tests)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 1 or x.size % 32:
            raise ValueError("quantize takes a 1-D array whose length is a multiple of 32")
        out = np.zeros(row_bytes, np.uint8)
        self._quantize[type_name](x.ctypes.data, out.ctypes.data, x.size)
        return out


_tasks: KVQTasks | None = None
_lock = threading.Lock()


def load_kvq_tasks() -> KVQTasks:
    global _tasks
    with _lock:
        if _tasks is None:
            _tasks = KVQTasks()
        return _tasks
