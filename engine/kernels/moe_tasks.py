"""The mixture of experts' tasks: engine.kernels.moe's glue and the matmul kernels, per thread.

Same contract as engine.kernels.tasks (void task(ptr args, ptr step, i64 tid, i64 n_threads),
args an int64 block named by a Layout, the STEP block's n_tokens the step's token count). With
k experts per token there are P = n_tokens * k (token, choice) pairs; the graph a block lays
out (engine.builders.GraphBuilder.route / expert_ffn) is

    router matmul -> task_moe_route (my tokens) -> | task_moe_group (thread 0: runs by expert)
    -> | task_moe_pack (my pairs: gather h, quantize per run) -> | task_moe_matmul gate, up
    -> | glu -> | task_moe_pack (quantize g per run) -> | task_moe_matmul down
    -> | task_moe_combine (my tokens: o = weighted sum of the k outputs)

(| a barrier). task_moe_matmul splits each chosen expert's weight rows across the threads,
so every expert's rows stream once per step whatever its token count, and an expert with no
tokens is skipped.
"""
from __future__ import annotations

import threading

from engine.kernels import jit
from engine.kernels.ir.text import IRFunction
from engine.kernels.tasks import STEP, Layout


def _layout(*spec: str) -> Layout:
    return Layout(tuple((name, kind) for name, kind in (s.split(":") for s in spec)))


ROUTE = _layout("fn:ptr", "logits:ptr", "ids:ptr", "weights:ptr", "n_expert:i64", "k:i64")
GROUP = _layout("fn:ptr", "ids:ptr", "n_expert:i64", "k:i64", "offsets:ptr", "padded:ptr",
                "rows:ptr", "pos:ptr")
PACK = _layout("gather:ptr", "src:ptr", "rows:ptr", "dst:ptr", "quantize:ptr", "xq:ptr",
               "n:i64", "nb:i64", "packed_row_bytes:i64", "offsets:ptr", "padded:ptr",
               "n_expert:i64", "k:i64")
EXPERT_MATMUL = _layout("fn:ptr", "w:ptr", "expert_bytes:i64", "x:ptr", "x_row_bytes:i64",
                        "packed:i64", "out:ptr", "nb:i64", "n_rows:i64", "offsets:ptr",
                        "padded:ptr", "n_expert:i64")
COMBINE = _layout("fn:ptr", "eo:ptr", "pos:ptr", "weights:ptr", "out:ptr", "n:i64", "k:i64")

_SIG = "(ptr noalias %args, ptr noalias %step, i64 %tid, i64 %nth)"


def _share(f: IRFunction, m: str) -> tuple[str, str]:
    """Thread %tid's part [M*tid/n, M*(tid+1)/n) of M items (tasks.py's row split)."""
    r0 = f.let(f"udiv i64 {f.mul(m, '%tid')}, %nth")
    r1 = f.let(f"udiv i64 {f.mul(m, f.add('%tid', 1))}, %nth")
    return r0, r1


def _tokens(f: IRFunction) -> str:
    return f.load("i64", "%step", STEP.offset("n_tokens"), align=8)


def _run(f: IRFunction, offsets: str, e: str) -> tuple[str, str]:
    """(start, end) of expert e's run of grouped rows."""
    return (f.load("i64", offsets, f.mul(e, 8), align=8),
            f.load("i64", offsets, f.mul(f.add(e, 1), 8), align=8))


def _task_route() -> str:
    """My tokens: fn = moe_route(logits rows, ids rows, weights rows, count, E, k)."""
    f = IRFunction(f"void @task_moe_route{_SIG}")
    a = ROUTE.load(f, "%args")
    r0, r1 = _share(f, _tokens(f))
    f.do(f"call void {a['fn']}(ptr {f.gep(a['logits'], f.mul(f.mul(r0, a['n_expert']), 4))}, "
         f"ptr {f.gep(a['ids'], f.mul(f.mul(r0, a['k']), 8))}, "
         f"ptr {f.gep(a['weights'], f.mul(f.mul(r0, a['k']), 4))}, "
         f"i64 {f.let(f'sub i64 {r1}, {r0}')}, i64 {a['n_expert']}, i64 {a['k']})")
    f.do("ret void")
    return f.text()


def _task_group() -> str:
    """Thread 0: fn = moe_group over all P pairs (a counting sort: a few ns per pair)."""
    f = IRFunction(f"void @task_moe_group{_SIG}")
    a = GROUP.load(f, "%args")
    pairs = f.mul(_tokens(f), a["k"])
    f.if_then(f.let("icmp eq i64 %tid, 0"), lambda: f.do(
        f"call void {a['fn']}(ptr {a['ids']}, i64 {pairs}, i64 {a['n_expert']}, i64 {a['k']}, "
        f"ptr {a['offsets']}, ptr {a['padded']}, ptr {a['rows']}, ptr {a['pos']})"))
    f.do("ret void")
    return f.text()


def _task_pack() -> str:
    """My pairs [p0, p1): dst rows = src[rows[p]] (when gather is set), then each run's part of
    them quantized into the run's packed activations (when quantize is set: quantized weights):
    quantize(run's dst rows, xq + padded[e] * packed_row_bytes, nb, lo, hi, run length)."""
    f = IRFunction(f"void @task_moe_pack{_SIG}")
    a = PACK.load(f, "%args")
    p0, p1 = _share(f, f.mul(_tokens(f), a["k"]))
    f.if_then(f.let(f"icmp ne ptr {a['gather']}, null"), lambda: f.do(
        f"call void {a['gather']}(ptr {a['src']}, ptr {a['rows']}, ptr {a['dst']}, i64 {p0}, "
        f"i64 {p1}, i64 {a['n']})"))

    def run(e: str) -> None:
        start, end = _run(f, a["offsets"], e)
        lo = f.let(f"call i64 @llvm.smax.i64(i64 {p0}, i64 {start})")
        hi = f.let(f"call i64 @llvm.smin.i64(i64 {p1}, i64 {end})")

        def quantize() -> None:
            src = f.gep(a["dst"], f.mul(f.mul(start, a["n"]), 4))
            xq = f.gep(a["xq"], f.mul(f.load("i64", a["padded"], f.mul(e, 8), align=8),
                                      a["packed_row_bytes"]))
            f.do(f"call void {a['quantize']}(ptr {src}, ptr {xq}, i64 {a['nb']}, "
                 f"i64 {f.let(f'sub i64 {lo}, {start}')}, i64 {f.let(f'sub i64 {hi}, {start}')}, "
                 f"i64 {f.let(f'sub i64 {end}, {start}')})")

        f.if_then(f.let(f"icmp slt i64 {lo}, {hi}"), quantize)

    f.if_then(f.let(f"icmp ne ptr {a['quantize']}, null"), lambda: f.each(a["n_expert"], run))
    f.do("ret void")
    return f.text()


def _task_expert_matmul() -> str:
    """Each expert e with a run: my share of its weight rows over the run's M_e tokens,
    fn(w + e * expert_bytes, x of the run, out rows of the run, nb, r0, r1, M_e, n_rows).
    The run's x starts at its grouped row (f32 inputs) or its padded row (packed ones)."""
    f = IRFunction(f"void @task_moe_matmul{_SIG}")
    a = EXPERT_MATMUL.load(f, "%args")
    r0, r1 = _share(f, a["n_rows"])
    packed = f.let(f"icmp ne i64 {a['packed']}, 0")

    def expert(e: str) -> None:
        start, end = _run(f, a["offsets"], e)
        m = f.let(f"sub i64 {end}, {start}")

        def call() -> None:
            x_row = f.if_value(packed, "i64",
                               lambda: f.load("i64", a["padded"], f.mul(e, 8), align=8), start)
            w = f.gep(a["w"], f.mul(e, a["expert_bytes"]))
            x = f.gep(a["x"], f.mul(x_row, a["x_row_bytes"]))
            out = f.gep(a["out"], f.mul(f.mul(start, a["n_rows"]), 4))
            f.do(f"call void {a['fn']}(ptr {w}, ptr {x}, ptr {out}, i64 {a['nb']}, i64 {r0}, "
                 f"i64 {r1}, i64 {m}, i64 {a['n_rows']})")

        f.if_then(f.let(f"icmp sgt i64 {m}, 0"), call)

    f.each(a["n_expert"], expert)
    f.do("ret void")
    return f.text()


def _task_combine() -> str:
    """My tokens: fn = moe_combine(eo, pos rows, weights rows, out rows, count, n, k)."""
    f = IRFunction(f"void @task_moe_combine{_SIG}")
    a = COMBINE.load(f, "%args")
    r0, r1 = _share(f, _tokens(f))
    f.do(f"call void {a['fn']}(ptr {a['eo']}, ptr {f.gep(a['pos'], f.mul(f.mul(r0, a['k']), 8))}, "
         f"ptr {f.gep(a['weights'], f.mul(f.mul(r0, a['k']), 4))}, "
         f"ptr {f.gep(a['out'], f.mul(f.mul(r0, a['n']), 4))}, "
         f"i64 {f.let(f'sub i64 {r1}, {r0}')}, i64 {a['n']}, i64 {a['k']})")
    f.do("ret void")
    return f.text()


TASK_NAMES = ("task_moe_route", "task_moe_group", "task_moe_pack", "task_moe_matmul",
              "task_moe_combine")


def build_moe_tasks_ir() -> str:
    return "\n".join(["declare i64 @llvm.smax.i64(i64, i64)", "declare i64 @llvm.smin.i64(i64, i64)",
                      _task_route(), _task_group(), _task_pack(), _task_expert_matmul(),
                      _task_combine()])


_address: dict[str, int] = {}
_lock = threading.Lock()


def task_addresses() -> dict[str, int]:
    """name -> address of each compiled task, compiled (or loaded from the disk cache) once."""
    with _lock:
        if not _address:
            lib = jit.compile_cached("moe_tasks", (), build_moe_tasks_ir)
            _address.update({name: lib.address(name) for name in TASK_NAMES})
        return _address
