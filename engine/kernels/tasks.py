"""Tasks: the per-thread pieces of a forward pass that the native pool runs as a graph.

Every task has the signature  void task_<name>(ptr args, ptr step, i64 tid, i64 n_threads)  and
does thread tid's share of one operation by calling the compiled kernels (matmul rows, rms_norm,
rope, silu_mul, the quantizers, attention) through function pointers held in its args. So the
arithmetic is exactly the kernels' own, whatever the thread count: a task only decides which
rows or attention items a thread takes.

`args` is an int64 array whose fields each task's Layout names (pointers and integers are 8
bytes; a float sits in the low 4 bytes of its field). `step` is the per-forward-call STEP block:
token count, positions, where each token's K/V go, the chunk table and the attention split.

Row split (row_range): thread t of n takes rows [M*t/n, M*(t+1)/n). Tasks over the same M use
the same split, so a thread reads only rows it wrote itself and such nodes need no barrier.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.kernels import jit
from engine.kernels.attention_ir import DEEP_CACHE, DEEP_MIN_QUERIES, TILED_MIN_QUERIES
from engine.kernels.ir.text import IRFunction


@dataclass(frozen=True)
class Layout:
    """Named 8-byte fields of an int64 argument block: kinds 'ptr', 'i64' or 'float'."""
    fields: tuple[tuple[str, str], ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {n: i for i, (n, _) in enumerate(self.fields)})

    def offset(self, name: str) -> int:
        return 8 * self._index[name]

    def pack(self, **values: int | float) -> np.ndarray:
        """int64 [n_fields]; pointers as integer addresses (0 = null)."""
        missing = {n for n, _ in self.fields} ^ set(values)
        if missing:
            raise ValueError(f"fields missing or unknown: {sorted(missing)}")
        out = np.zeros(len(self.fields), np.int64)
        for i, (name, kind) in enumerate(self.fields):
            v = values[name]
            if kind == "float":
                out[i] = int(np.array([v], np.float32).view(np.uint32)[0])
            else:
                out[i] = int(v)
        return out

    def fill(self, args: np.ndarray, **values: int) -> None:
        """Overwrite integer/pointer fields of an existing block in place."""
        index = self._index
        for name, value in values.items():
            args[index[name]] = value

    def load(self, f: IRFunction, base: str) -> dict[str, str]:
        """Emit a load of every field from `base`; returns name -> SSA value."""
        ty = {"ptr": "ptr", "i64": "i64", "float": "float"}
        return {name: f.load(ty[kind], base, 8 * i, align=8 if kind != "float" else 4)
                for i, (name, kind) in enumerate(self.fields)}


def _layout(*spec: str) -> Layout:
    """'name:kind' strings -> Layout."""
    return Layout(tuple(tuple(s.split(":")) for s in spec))  # type: ignore[misc]


# The per-call block every task can read, filled by engine.kv.KVLayout.step_tables. Per cache
# group g (layers sharing a row count, engine.kv): kv_rows [n_groups, n_tokens] cache rows of the
# tokens' K/V, kv_mirror [n_groups, n_tokens] a second row for them (a ring's mirror) or -1; chunks [n_groups, n_chunks, 4] rows of (first token row, n_q, pos0, kv_row0: the
# slot's first row). Attention segments: seg_start [n_threads + 1] indexes segs [n_seg, 3] rows of
# (chunk, item begin, item end). bidirectional [n_chunks, 2]: per chunk the queries [a, b) that
# see each other (a == b: none), read only by the bidirectional attention task (last, so the
# other tasks' offsets stay).
STEP = _layout("n_tokens:i64", "n_out:i64", "n_chunks:i64", "positions:ptr", "kv_rows:ptr",
               "kv_mirror:ptr", "chunks:ptr", "seg_start:ptr", "segs:ptr", "out_rows:ptr",
               "bidirectional:ptr")

MATMUL = _layout("fn:ptr", "w:ptr", "x:ptr", "out:ptr", "nb:i64", "n_rows:i64", "m_at:i64")
NORM = _layout("fn:ptr", "x:ptr", "residual:ptr", "weight:ptr", "out:ptr", "n:i64", "eps:float",
               "m_at:i64", "gather:i64")
QUANT = _layout("fn:ptr", "src:ptr", "dst:ptr", "nb:i64", "m_at:i64")
GLU = _layout("fn:ptr", "gate:ptr", "up:ptr", "n:i64", "m_at:i64")
BIAS = _layout("fn:ptr", "x:ptr", "bias:ptr", "n:i64", "m_at:i64")
SCALE = _layout("fn:ptr", "x:ptr", "n:i64", "c:float", "m_at:i64")
HEAD_NORM = _layout("fn:ptr", "x:ptr", "weight:ptr", "n_head:i64", "head_dim:i64", "eps:float")
ROPE_STORE = _layout("rope:ptr", "q:ptr", "k:ptr", "v:ptr", "n_head:i64", "n_kv_head:i64",
                     "head_dim:i64", "half_rot:i64", "cos:ptr", "sin:ptr", "n_table:i64",
                     "k_cache:ptr", "v_cache:ptr", "group:i64")
ATTENTION = _layout("f16acc:ptr", "exact:ptr", "q:ptr", "k_cache:ptr", "v_cache:ptr", "out:ptr",
                    "scratch:ptr", "scratch_bytes:i64", "n_head:i64", "n_kv_head:i64",
                    "head_dim:i64", "scale:float", "group:i64", "window:i64", "ring:i64",
                    "softcap:float")
ATTENTION_SINKS = Layout(ATTENTION.fields + (("sinks", "ptr"),))  # gpt-oss: + float* [n_head]

M_TOKENS = STEP.offset("n_tokens")  # m_at values: which STEP count a task's rows follow
M_OUT = STEP.offset("n_out")

def _prefix_cost(i: int, n_head: int, pos0: int) -> int:
    """Keys read by a chunk's first i items (item w = query * n_head + head reads pos0+query+1)."""
    full, rest = divmod(i, n_head)
    return n_head * (full * (pos0 + 1) + full * (full - 1) // 2) + rest * (pos0 + full + 1)


def split_attention(chunks: list[tuple[int, int]], n_head: int,
                    n_threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut the attention items of all chunks ((n_q, pos0) each) into n_threads contiguous runs of
    about equal cost (keys read). Returns (seg_start int64 [n_threads + 1], segs int64 [n, 3] of
    (chunk, item begin, item end)): thread t runs segs[seg_start[t]:seg_start[t + 1]].

    Which thread computes an item never changes its result, so the split is free to follow cost.
    """
    n_items = [n_q * n_head for n_q, _ in chunks]
    costs = [_prefix_cost(n, n_head, pos0) for n, (_, pos0) in zip(n_items, chunks)]
    total = sum(costs)
    # cuts: (chunk, item) where thread t's run starts, t = 1 .. n_threads - 1
    cuts: list[tuple[int, int]] = []
    before = 0
    for c, ((_, pos0), n, cost) in enumerate(zip(chunks, n_items, costs)):
        while len(cuts) < n_threads - 1 and before + cost >= total * (len(cuts) + 1) / n_threads:
            need = total * (len(cuts) + 1) / n_threads - before
            lo, hi = 0, n  # smallest i with prefix cost >= need
            while lo < hi:
                mid = (lo + hi) // 2
                if _prefix_cost(mid, n_head, pos0) >= need:
                    hi = mid
                else:
                    lo = mid + 1
            cuts.append((c, lo))
        before += cost
    while len(cuts) < n_threads - 1:
        cuts.append((len(chunks), 0))
    bounds = [(0, 0), *cuts, (len(chunks), 0)]
    segs: list[tuple[int, int, int]] = []
    seg_start = [0]
    for (c0, i0), (c1, i1) in itertools.pairwise(bounds):
        for c in range(c0, min(c1, len(chunks) - 1) + 1):
            lo = i0 if c == c0 else 0
            hi = i1 if c == c1 else n_items[c]
            if hi > lo:
                segs.append((c, lo, hi))
        seg_start.append(len(segs))
    return np.array(seg_start, np.int64), np.array(segs, np.int64).reshape(-1, 3)


_SIG = "(ptr noalias %args, ptr noalias %step, i64 %tid, i64 %nth)"


def _row_range(f: IRFunction, m: str) -> tuple[str, str]:
    """Thread %tid's rows [M*tid/n, M*(tid+1)/n)."""
    r0 = f.let(f"udiv i64 {f.mul(m, '%tid')}, %nth")
    r1 = f.let(f"udiv i64 {f.mul(m, f.add('%tid', 1))}, %nth")
    return r0, r1


def _step_count(f: IRFunction, at: int | str) -> str:
    return f.load("i64", "%step", at, align=8)


def _task_matmul() -> str:
    """Weight rows split across threads: fn(w, x, out, nb, r0, r1, M, N) (engine.kernels.matmul)."""
    f = IRFunction(f"void @task_matmul{_SIG}")
    a = MATMUL.load(f, "%args")
    m = _step_count(f, a["m_at"])
    r0, r1 = _row_range(f, a["n_rows"])
    f.if_then(f.let(f"icmp ne i64 {m}, 0"), lambda: f.do(  # no rows (no chunk wants logits)
        f"call void {a['fn']}(ptr {a['w']}, ptr {a['x']}, ptr {a['out']}, i64 {a['nb']}, "
        f"i64 {r0}, i64 {r1}, i64 {m}, i64 {a['n_rows']})"))
    f.do("ret void")
    return f.text()


def _task_norm() -> str:
    """Per row i of mine: src = gather ? out_rows[i] : i; x[src] += residual[src] (if given);
    out[i] = rms_norm(x[src]) * weight. fn is ops' rms_norm(x, w, out, 1, n, eps)."""
    f = IRFunction(f"void @task_norm{_SIG}")
    a = NORM.load(f, "%args")
    m = _step_count(f, a["m_at"])
    r0, r1 = _row_range(f, m)
    row_bytes = f.mul(a["n"], 4)
    n_vec = f.let(f"and i64 {a['n']}, -8")
    out_rows = f.load("ptr", "%step", STEP.offset("out_rows"), align=8)
    gather = f.let(f"icmp ne i64 {a['gather']}, 0")
    has_res = f.let(f"icmp ne ptr {a['residual']}, null")

    def row(i: str) -> None:
        src = f.if_value(gather, "i64", lambda: f.load("i64", out_rows, f.mul(i, 8), align=8), i)
        xr = f.gep(a["x"], f.mul(src, row_bytes))

        def add_residual() -> None:
            rr = f.gep(a["residual"], f.mul(src, row_bytes))

            def vec(k: str, _: list[str]) -> list[str]:
                off = f.mul(k, 32)
                s = f.let(f"fadd <8 x float> {f.load('<8 x float>', xr, off, 4)}, "
                          f"{f.load('<8 x float>', rr, off, 4)}")
                f.store("<8 x float>", s, xr, off, 4)
                return []

            f.loop(f.let(f"lshr i64 {n_vec}, 3"), [], vec)

            def tail(j: str) -> None:
                off = f.mul(j, 4)
                s = f.let(f"fadd float {f.load('float', xr, off, 4)}, {f.load('float', rr, off, 4)}")
                f.store("float", s, xr, off, 4)

            f.loop_range(n_vec, a["n"], tail)

        f.if_then(has_res, add_residual)
        dst = f.gep(a["out"], f.mul(i, row_bytes))
        f.do(f"call void {a['fn']}(ptr {xr}, ptr {a['weight']}, ptr {dst}, i64 1, i64 {a['n']}, "
             f"float {a['eps']})")

    f.loop_range(r0, r1, row)
    f.do("ret void")
    return f.text()


def _row_task(name: str, layout: Layout, call: Callable[[IRFunction, dict[str, str], str, str], str]) -> str:
    """A task over my rows [r0, r1) of the STEP count at m_at: call(f, args, r0, r1) gives the
    one kernel call that does them."""
    f = IRFunction(f"void @task_{name}{_SIG}")
    a = layout.load(f, "%args")
    r0, r1 = _row_range(f, _step_count(f, a["m_at"]))
    f.do(call(f, a, r0, r1))
    f.do("ret void")
    return f.text()


def _rows_at(f: IRFunction, a: dict[str, str], base: str, r0: str, r1: str) -> tuple[str, str]:
    """(row r0 of the f32 [M, n] array at a[base], floats in rows [r0, r1))."""
    return (f.gep(a[base], f.mul(r0, f.mul(a["n"], 4))),
            f.mul(f.let(f"sub i64 {r1}, {r0}"), a["n"]))


def _task_quant() -> str:
    """My rows of src quantized into the packed activations of all M rows: fn(src, dst, nb, r0, r1, M)."""
    return _row_task("quant", QUANT, lambda f, a, r0, r1: (
        f"call void {a['fn']}(ptr {a['src']}, ptr {a['dst']}, i64 {a['nb']}, i64 {r0}, i64 {r1}, "
        f"i64 {_step_count(f, a['m_at'])})"))


def _task_glu() -> str:
    """My rows: gate = act(gate) * up, fn is ops' silu_mul or gelu_mul(gate, up, out, count)."""
    def call(f: IRFunction, a: dict[str, str], r0: str, r1: str) -> str:
        g, count = _rows_at(f, a, "gate", r0, r1)
        u, _ = _rows_at(f, a, "up", r0, r1)
        return f"call void {a['fn']}(ptr {g}, ptr {u}, ptr {g}, i64 {count})"
    return _row_task("glu", GLU, call)


def _task_bias() -> str:
    """My rows: x[row] += bias, fn is ops' add_bias(x, bias, out, n_rows, n)."""
    def call(f: IRFunction, a: dict[str, str], r0: str, r1: str) -> str:
        x, _ = _rows_at(f, a, "x", r0, r1)
        return (f"call void {a['fn']}(ptr {x}, ptr {a['bias']}, ptr {x}, "
                f"i64 {f.let(f'sub i64 {r1}, {r0}')}, i64 {a['n']})")
    return _row_task("bias", BIAS, call)


def _task_scale() -> str:
    """My rows: x[row] *= c, fn is ops' scale(x, out, count, c)."""
    def call(f: IRFunction, a: dict[str, str], r0: str, r1: str) -> str:
        x, count = _rows_at(f, a, "x", r0, r1)
        return f"call void {a['fn']}(ptr {x}, ptr {x}, i64 {count}, float {a['c']})"
    return _row_task("scale", SCALE, call)


def _task_head_norm() -> str:
    """My token rows: every head vector of x normed in place, rms_norm(head) * weight (qwen3's and
    gemma3's q/k norm); fn is ops' rms_norm over (rows * n_head) rows of head_dim."""
    f = IRFunction(f"void @task_head_norm{_SIG}")
    a = HEAD_NORM.load(f, "%args")
    m = _step_count(f, STEP.offset("n_tokens"))
    r0, r1 = _row_range(f, m)
    row_bytes = f.mul(f.mul(a["n_head"], a["head_dim"]), 4)
    x = f.gep(a["x"], f.mul(r0, row_bytes))
    n = f.mul(f.let(f"sub i64 {r1}, {r0}"), a["n_head"])
    f.do(f"call void {a['fn']}(ptr {x}, ptr {a['weight']}, ptr {x}, i64 {n}, i64 {a['head_dim']}, "
         f"float {a['eps']})")
    f.do("ret void")
    return f.text()


def _emit_to_f16(f: IRFunction, src: str, dst: str, n: str, f16c: bool) -> None:
    """dst[j] = f16(src[j]) for j < n (n % 8 == 0), rounding to nearest even like numpy.

    Portable form (no F16C): normal results rebias the exponent and round with the
    add-half-ulp-plus-lsb trick; results that are f16 subnormals come from adding 0.5f, which
    puts the value's f16-subnormal bits in the low mantissa with the FPU's own rounding;
    overflow gives inf, NaN a quiet NaN.
    """
    def vec(k: str, _: list[str]) -> list[str]:
        x = f.load("<8 x float>", src, f.mul(k, 32), 4)
        if f16c:
            h = f.let(f"fptrunc <8 x float> {x} to <8 x half>")
            f.store("<8 x half>", h, dst, f.mul(k, 16), 2)
            return []

        def c(v: int) -> str:
            return "<" + ", ".join([f"i32 {v}"] * 8) + ">"
        bits = f.let(f"bitcast <8 x float> {x} to <8 x i32>")
        sign = f.let(f"and <8 x i32> {f.let(f'lshr <8 x i32> {bits}, {c(16)}')}, {c(0x8000)}")
        mag = f.let(f"and <8 x i32> {bits}, {c(0x7FFFFFFF)}")
        lsb = f.let(f"and <8 x i32> {f.let(f'lshr <8 x i32> {mag}, {c(13)}')}, {c(1)}")
        normal = f.let(f"sub <8 x i32> {mag}, {c(0x38000000 - 0xFFF)}")
        normal = f.let(f"lshr <8 x i32> {f.let(f'add <8 x i32> {normal}, {lsb}')}, {c(13)}")
        magf = f.let(f"bitcast <8 x i32> {mag} to <8 x float>")
        half = "<" + ", ".join(["float 0.5"] * 8) + ">"
        sub = f.let(f"bitcast <8 x float> {f.let(f'fadd <8 x float> {magf}, {half}')} to <8 x i32>")
        sub = f.let(f"sub <8 x i32> {sub}, {c(0x3F000000)}")
        h = f.let(f"select <8 x i1> {f.let(f'icmp ult <8 x i32> {mag}, {c(0x38800000)}')}, "
                  f"<8 x i32> {sub}, <8 x i32> {normal}")
        h = f.let(f"select <8 x i1> {f.let(f'icmp uge <8 x i32> {mag}, {c(0x477FF000)}')}, "
                  f"<8 x i32> {c(0x7C00)}, <8 x i32> {h}")
        h = f.let(f"select <8 x i1> {f.let(f'icmp ugt <8 x i32> {mag}, {c(0x7F800000)}')}, "
                  f"<8 x i32> {c(0x7E00)}, <8 x i32> {h}")
        h = f.let(f"trunc <8 x i32> {f.let(f'or <8 x i32> {h}, {sign}')} to <8 x i16>")
        f.store("<8 x i16>", h, dst, f.mul(k, 16), 2)
        return []

    f.loop(f.let(f"lshr i64 {n}, 3"), [], vec)


def _to_f16(f16c: bool) -> str:
    """void to_f16(ptr src f32 [n], ptr dst f16 [n], i64 n), n % 8 == 0 (the numpy twin: astype)."""
    f = IRFunction("void @to_f16(ptr noalias %src, ptr noalias %dst, i64 %n)")
    _emit_to_f16(f, "%src", "%dst", "%n", f16c)
    f.do("ret void")
    return f.text()


def rope_rows(f: IRFunction, a: dict[str, str]) -> tuple[str, str, str, str]:
    """A rope-and-store task's first half: my token rows [r0, r1) of q and k roped in place
    (ops' rope or rope_neox, ROPE_STORE's fields). Returns (r0, r1, kv_rows, mirror): this
    layer's group's rows of STEP.kv_rows and STEP.kv_mirror, for the store that follows."""
    m = _step_count(f, STEP.offset("n_tokens"))
    r0, r1 = _row_range(f, m)
    positions = f.load("ptr", "%step", STEP.offset("positions"), align=8)
    kv_rows = f.load("ptr", "%step", STEP.offset("kv_rows"), align=8)
    kv_rows = f.gep(kv_rows, f.mul(f.mul(a["group"], m), 8))  # this layer's group's rows
    mirror = f.load("ptr", "%step", STEP.offset("kv_mirror"), align=8)
    mirror = f.gep(mirror, f.mul(f.mul(a["group"], m), 8))
    q_row = f.mul(f.mul(a["n_head"], a["head_dim"]), 4)
    kv_row = f.mul(f.mul(a["n_kv_head"], a["head_dim"]), 4)
    count = f.let(f"sub i64 {r1}, {r0}")
    pos = f.gep(positions, f.mul(r0, 8))
    for x, heads, row_bytes in (("q", "n_head", q_row), ("k", "n_kv_head", kv_row)):
        xr = f.gep(a[x], f.mul(r0, row_bytes))
        f.let(f"call i64 {a['rope']}(ptr {xr}, ptr {xr}, ptr {pos}, i64 {count}, i64 {a[heads]}, "
              f"i64 {a['head_dim']}, i64 {a['half_rot']}, ptr {a['cos']}, ptr {a['sin']}, "
              f"i64 {a['n_table']})")
    return r0, r1, kv_rows, mirror


def store_rows(f: IRFunction, r0: str, r1: str, kv_rows: str, mirror: str,
               to_row: Callable[[str, str], None]) -> None:
    """For my token rows t: to_row(t, row) at its cache row kv_rows[t], and at mirror[t] too
    where that is a row (>= 0)."""
    def store(t: str) -> None:
        to_row(t, f.load("i64", kv_rows, f.mul(t, 8), align=8))
        second = f.load("i64", mirror, f.mul(t, 8), align=8)
        f.if_then(f.let(f"icmp sge i64 {second}, 0"), lambda: to_row(t, second))

    f.loop_range(r0, r1, store)


def _task_rope_store(f16c: bool) -> str:
    """My token rows t: rope q[t] and k[t] in place (ops' rope or rope_neox), then the K/V cache
    rows kv_rows[group, t] of this layer get f16(k[t]), f16(v[t]), and kv_mirror[group, t] too
    where it is a row (>= 0)."""
    f = IRFunction(f"void @task_rope_store{_SIG}")
    a = ROPE_STORE.load(f, "%args")
    r0, r1, kv_rows, mirror = rope_rows(f, a)
    kv_dim = f.mul(a["n_kv_head"], a["head_dim"])
    kv_row = f.mul(kv_dim, 4)

    def to_row(t: str, row: str) -> None:
        dst = f.mul(row, f.mul(kv_dim, 2))
        for x, cache in (("k", "k_cache"), ("v", "v_cache")):
            _emit_to_f16(f, f.gep(a[x], f.mul(t, kv_row)), f.gep(a[cache], dst), kv_dim, f16c)

    store_rows(f, r0, r1, kv_rows, mirror, to_row)
    f.do("ret void")
    return f.text()


def _task_attention(sinks: bool = False, bidirectional: bool = False) -> str:
    """My segments (chunk c, items [w0, w1)) of STEP.segs[seg_start[tid] .. seg_start[tid+1]]:
    attention (engine.kernels.attention) of chunk c's queries against its slot's cache rows, the
    exact function when the chunk takes the tiles (attention_ir.takes_tiles), else the
    f16-accumulator one.
    sinks: task_attention_sinks, whose functions take ATTENTION_SINKS' sinks last.
    bidirectional: its functions also take the chunk's row of STEP.bidirectional, last."""
    f = IRFunction(f"void @{_attention_task_name(sinks, bidirectional)}{_SIG}")
    a = (ATTENTION_SINKS if sinks else ATTENTION).load(f, "%args")
    sink_arg = f", ptr {a['sinks']}" if sinks else ""
    q_row = f.mul(f.mul(a["n_head"], a["head_dim"]), 4)
    kv_row = f.mul(f.mul(a["n_kv_head"], a["head_dim"]), 2)
    scratch = f.gep(a["scratch"], f.mul("%tid", a["scratch_bytes"]))
    bi_table = f.load("ptr", "%step", STEP.offset("bidirectional"), align=8) if bidirectional else ""

    def segment(c: str, w0: str, w1: str, row0: str, n_q: str, pos0: str, kv0: str) -> None:
        many = f.let(f"icmp sge i64 {n_q}, {TILED_MIN_QUERIES}")   # attention_ir.takes_tiles
        deep = f.let(f"and i1 {f.let(f'icmp sge i64 {n_q}, {DEEP_MIN_QUERIES}')}, "
                     f"{f.let(f'icmp sge i64 {pos0}, {DEEP_CACHE}')}")
        tiled = f.let(f"or i1 {many}, {deep}")
        fn = f.select(tiled, "ptr", a["exact"], a["f16acc"])
        q = f.gep(a["q"], f.mul(row0, q_row))
        out = f.gep(a["out"], f.mul(row0, q_row))
        kv_off = f.mul(kv0, kv_row)
        bi_arg = ""
        if bidirectional:
            bi = f.gep(bi_table, f.mul(c, 16))
            bi_arg = "".join(f", i64 {f.load('i64', bi, 8 * j, align=8)}" for j in range(2))
        f.do(f"call void {fn}(ptr {q}, ptr {f.gep(a['k_cache'], kv_off)}, "
             f"ptr {f.gep(a['v_cache'], kv_off)}, ptr {out}, ptr {scratch}, i64 {n_q}, "
             f"i64 {a['n_head']}, i64 {a['n_kv_head']}, i64 {a['head_dim']}, i64 {pos0}, "
             f"float {a['scale']}, i64 {w0}, i64 {w1}, i64 {a['window']}, i64 {a['ring']}, "
             f"float {a['softcap']}{sink_arg}{bi_arg})")

    my_segments(f, a["group"], segment)
    f.do("ret void")
    return f.text()


def my_segments(f: IRFunction, group: str,
                visit: Callable[[str, str, str, str, str, str, str], None]) -> None:
    """Thread %tid's attention segments, STEP.segs[seg_start[tid] .. seg_start[tid + 1]]:
    visit(chunk c, item begin, item end, and c's row of this layer's group's chunk table:
    first token row, n_q, pos0, the slot's first cache row)."""
    seg_start = f.load("ptr", "%step", STEP.offset("seg_start"), align=8)
    segs = f.load("ptr", "%step", STEP.offset("segs"), align=8)
    chunks = f.load("ptr", "%step", STEP.offset("chunks"), align=8)
    n_chunks = f.load("i64", "%step", STEP.offset("n_chunks"), align=8)
    chunks = f.gep(chunks, f.mul(f.mul(group, n_chunks), 32))  # this layer's group's table
    s0 = f.load("i64", seg_start, f.mul("%tid", 8), align=8)
    s1 = f.load("i64", seg_start, f.mul(f.add("%tid", 1), 8), align=8)

    def segment(s: str) -> None:
        seg = f.gep(segs, f.mul(s, 24))
        c, w0, w1 = (f.load("i64", seg, 8 * j, align=8) for j in range(3))
        chunk = f.gep(chunks, f.mul(c, 32))
        row0, n_q, pos0, kv0 = (f.load("i64", chunk, 8 * j, align=8) for j in range(4))
        visit(c, w0, w1, row0, n_q, pos0, kv0)

    f.loop_range(s0, s1, segment)


def build_tasks_ir(f16c: bool) -> str:
    return "\n".join([_task_matmul(), _task_norm(), _task_quant(), _task_glu(), _task_bias(),
                      _task_scale(), _task_head_norm(), _task_rope_store(f16c), _task_attention(), _to_f16(f16c)])


TASK_NAMES = ("task_matmul", "task_norm", "task_quant", "task_glu", "task_bias", "task_scale", "task_head_norm",
              "task_rope_store", "task_attention")


class Tasks:
    """Addresses of the compiled tasks (for graph nodes), loaded once per process and f16c."""

    def __init__(self, f16c: bool) -> None:
        lib = jit.compile_cached("tasks", (f16c,), lambda: build_tasks_ir(f16c))
        self.address = {name: lib.address(name) for name in TASK_NAMES}
        self._to_f16 = lib.function("to_f16", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    def to_f16(self, x: np.ndarray) -> np.ndarray:
        """float32 [n] (n % 8 == 0) -> float16 [n] through the compiled converter (for tests)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 1 or x.size % 8:
            raise ValueError("to_f16 takes a 1-D array whose length is a multiple of 8")
        out = np.empty(x.size, np.float16)
        self._to_f16(x.ctypes.data, out.ctypes.data, x.size)
        return out


def _attention_task_name(sinks: bool, bidirectional: bool) -> str:
    return "task_attention" + ("_sinks" if sinks else "") + ("_bidirectional" if bidirectional else "")


_attention_tasks: dict[tuple[bool, bool], int] = {}


def attention_task(sinks: bool, bidirectional: bool) -> int:
    """The address of the attention task for kernels built with sinks (ATTENTION_SINKS args)
    and/or bidirectional (ATTENTION or ATTENTION_SINKS args, STEP.bidirectional read), compiled
    once, each in a module of its own: the other families' tasks module stays as it was."""
    name = _attention_task_name(sinks, bidirectional)
    with _tasks_lock:
        if (sinks, bidirectional) not in _attention_tasks:
            lib = jit.compile_cached(name.replace("task_", "tasks_", 1), (),
                                     lambda: _task_attention(sinks, bidirectional))
            _attention_tasks[sinks, bidirectional] = lib.address(name)
        return _attention_tasks[sinks, bidirectional]


def attention_sinks_task() -> int:
    """The address of task_attention_sinks (ATTENTION_SINKS args)."""
    return attention_task(sinks=True, bidirectional=False)


_tasks: dict[bool, Tasks] = {}
_tasks_lock = threading.Lock()


def load_tasks(f16c: bool) -> Tasks:
    with _tasks_lock:
        if f16c not in _tasks:
            _tasks[f16c] = Tasks(f16c)
        return _tasks[f16c]
