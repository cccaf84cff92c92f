"""The tokenizer's merge loop, compiled: engine.tokenizer.merge's heap algorithm on symbol ids.

    merge(sym, n, keys, prio, merged, n_pairs, nxt, prv, heap, pops) -> number of symbols left

  sym     int32 [n]        symbol ids in; the merged symbols out, in order (sym[0:result])
  keys    int64 [n_pairs]  the mergeable pairs (left id << 32 | right id), sorted ascending
  prio    int32 [n_pairs]  a pair's priority: lower merges first (the BPE rank, or the SPM score's
                           rank among all scores); ties go to the leftmost pair
  merged  int32 [n_pairs]  the id of the symbol a pair becomes
  nxt, prv int32 [n]       scratch: the symbol list's links
  heap    int64 [3n + 1]   scratch: (priority << 32 | left position) min-heap; a merge pushes
                           at most two entries, so 3n always holds them
  pops    int64 [1]        out: heap pops made (the tests bound it by 3n: the loop's cost)

A popped entry is acted on only if the pair now at its position has the entry's priority: the
pair there is then the lowest-keyed pair there is, and merging it is what a queue of exact
entries would do at this step (engine.tokenizer.merge argues it; the tests compare the two).
Pair lookups are binary searches over `keys` (log2 of 50k merges: 16 steps).

Why compiled: the Python loop costs ~2 us per merge, so a 64 KiB word (64k merges) takes
~140 ms of CPU; here ~9 ms. merge_spm.py runs the same loop for SentencePiece vocabularies.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from engine.kernels.jit import CFunction, CompiledLibrary, compile_cached

I32, I64 = ir.IntType(32), ir.IntType(64)
BOOL = ir.IntType(1)


def _c(v: int, ty: ir.Type = I64) -> ir.Constant:
    return ir.Constant(ty, v)


class _Loop:
    """while-loop scaffolding: cond block, body block, exit block."""

    def __init__(self, b: ir.IRBuilder, name: str) -> None:
        self.b = b
        self.cond = b.append_basic_block(name + ".cond")
        self.body = b.append_basic_block(name + ".body")
        self.end = b.append_basic_block(name + ".end")
        b.branch(self.cond)
        b.position_at_end(self.cond)

    def test(self, c: ir.Value) -> None:
        self.b.cbranch(c, self.body, self.end)
        self.b.position_at_end(self.body)

    def close(self) -> None:
        if not self.b.block.is_terminated:
            self.b.branch(self.cond)
        self.b.position_at_end(self.end)


def _lower_bound(b: ir.IRBuilder, keys: ir.Value, n: ir.Value, key: ir.Value) -> ir.Value:
    """Binary search in keys[0:n] (i64, sorted ascending as unsigned): the i64 slot holding the
    first index whose key is not below `key` (n when none is)."""
    lo, hi = b.alloca(I64), b.alloca(I64)
    b.store(_c(0), lo)
    b.store(n, hi)
    loop = _Loop(b, "search")
    loop.test(b.icmp_signed("<", b.load(lo), b.load(hi)))
    l_, h_ = b.load(lo), b.load(hi)
    mid = b.lshr(b.add(l_, h_), _c(1))
    below = b.icmp_unsigned("<", b.load(b.gep(keys, [mid])), key)
    b.store(b.select(below, b.add(mid, _c(1)), l_), lo)
    b.store(b.select(below, h_, mid), hi)
    loop.close()
    return lo


def _lookup(module: ir.Module) -> ir.Function:
    """i64 lookup(keys*, n_pairs, key): index of key in the sorted keys, or -1."""
    fn = ir.Function(module, ir.FunctionType(I64, [I64.as_pointer(), I64, I64]), name="lookup")
    fn.linkage = "internal"
    keys, n, key = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lo = _lower_bound(b, keys, n, key)
    at = b.load(lo)
    inside = b.icmp_signed("<", at, n)
    found_bb, done_bb = b.append_basic_block("check"), b.append_basic_block("done")
    b.cbranch(inside, found_bb, done_bb)
    b.position_at_end(found_bb)
    hit = b.icmp_unsigned("==", b.load(b.gep(keys, [at])), key)
    r = b.select(hit, at, _c(-1))
    b.ret(r)
    b.position_at_end(done_bb)
    b.ret(_c(-1))
    return fn


def _push(module: ir.Module) -> ir.Function:
    """void push(heap*, size*, entry): sift up."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64.as_pointer(), I64]),
                     name="push")
    fn.linkage = "internal"
    heap, size, e = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    i = b.alloca(I64)
    h = b.load(size)
    b.store(b.add(h, _c(1)), size)
    b.store(h, i)
    loop = _Loop(b, "up")
    loop.test(b.icmp_signed(">", b.load(i), _c(0)))
    cur = b.load(i)
    parent = b.lshr(b.sub(cur, _c(1)), _c(1))
    pv = b.load(b.gep(heap, [parent]))
    stop = b.icmp_unsigned("<=", pv, e)
    move, out = b.append_basic_block("move"), loop.end
    b.cbranch(stop, out, move)
    b.position_at_end(move)
    b.store(pv, b.gep(heap, [cur]))
    b.store(parent, i)
    loop.close()
    b.store(e, b.gep(heap, [b.load(i)]))
    b.ret_void()
    return fn


def _pop(module: ir.Module) -> ir.Function:
    """i64 pop(heap*, size*): the smallest entry; sift down the last one."""
    fn = ir.Function(module, ir.FunctionType(I64, [I64.as_pointer(), I64.as_pointer()]), name="pop")
    fn.linkage = "internal"
    heap, size = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    top = b.load(b.gep(heap, [_c(0)]))
    h = b.sub(b.load(size), _c(1))
    b.store(h, size)
    last = b.load(b.gep(heap, [h]))
    i = b.alloca(I64)
    b.store(_c(0), i)
    loop = _Loop(b, "down")
    cur = b.load(i)
    left = b.add(b.mul(cur, _c(2)), _c(1))
    loop.test(b.icmp_signed("<", left, h))
    cur = b.load(i)
    left = b.add(b.mul(cur, _c(2)), _c(1))
    right = b.add(left, _c(1))
    lv = b.load(b.gep(heap, [left]))
    has_right = b.icmp_signed("<", right, h)
    rv = b.load(b.gep(heap, [b.select(has_right, right, left)]))
    take_right = b.and_(has_right, b.icmp_unsigned("<", rv, lv))
    child = b.select(take_right, right, left)
    cv = b.select(take_right, rv, lv)
    stop = b.icmp_unsigned("<=", last, cv)
    move = b.append_basic_block("move")
    b.cbranch(stop, loop.end, move)
    b.position_at_end(move)
    b.store(cv, b.gep(heap, [cur]))
    b.store(child, i)
    loop.close()
    b.store(last, b.gep(heap, [b.load(i)]))
    b.ret(top)
    return fn


def _link_and_queue(b: ir.IRBuilder, i: ir.Value, n: ir.Value, nxt: ir.Value, prv: ir.Value,
                    push_pair: Callable[[ir.Value, ir.Value], None],
                    each: Callable[[ir.Value], None] | None = None) -> None:
    """The loops' common start: symbols 0..n-1 linked in a list (nxt[k] = k + 1, prv[k] = k - 1,
    nxt[n - 1] = -1; `each(k)` per symbol), then every adjacent pair offered to push_pair.
    `i` is an i64 slot the caller owns."""
    b.store(_c(0), i)
    loop = _Loop(b, "links")
    loop.test(b.icmp_signed("<", b.load(i), n))
    k = b.load(i)
    b.store(b.trunc(b.add(k, _c(1)), I32), b.gep(nxt, [k]))
    b.store(b.trunc(b.sub(k, _c(1)), I32), b.gep(prv, [k]))
    if each is not None:
        each(k)
    b.store(b.add(k, _c(1)), i)
    loop.close()
    last = b.sub(n, _c(1))
    b.store(_c(-1, I32), b.gep(nxt, [last]))
    b.store(_c(0), i)
    loop = _Loop(b, "pairs")
    loop.test(b.icmp_signed("<", b.load(i), last))
    k = b.load(i)
    push_pair(k, b.add(k, _c(1)))
    b.store(b.add(b.load(i), _c(1)), i)
    loop.close()


def _unlink_and_requeue(b: ir.IRBuilder, left: ir.Value, right: ir.Value, nxt: ir.Value,
                        prv: ir.Value, push_pair: Callable[[ir.Value, ir.Value], None]) -> None:
    """After `right` merged into `left`: unlink `right` from the list and offer the two new
    neighbour pairs (left, its next) and (its previous, left) to push_pair."""
    after32 = b.load(b.gep(nxt, [right]))
    b.store(after32, b.gep(nxt, [left]))
    with b.if_then(b.icmp_signed(">=", after32, _c(0, I32))):
        after = b.sext(after32, I64)
        b.store(b.trunc(left, I32), b.gep(prv, [after]))
        push_pair(left, after)
    before32 = b.load(b.gep(prv, [left]))
    with b.if_then(b.icmp_signed(">=", before32, _c(0, I32))):
        push_pair(b.sext(before32, I64), left)


def _next_pair(b: ir.IRBuilder, loop: _Loop, pop: ir.Function, heap: ir.Value, size: ir.Value,
               pops: ir.Value, sym: ir.Value, nxt: ir.Value
               ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """In the merge loop: pop the best queued pair (counting the pop) and go on to the next
    unless its left symbol is alive (sym >= 0) with a right neighbour. Returns (left, its
    symbol, right, want): i64 positions, the i32 symbol, the i32 priority it was queued with."""
    e = b.call(pop, [heap, size])
    b.store(b.add(b.load(pops), _c(1)), pops)
    left = b.and_(e, _c(0xFFFFFFFF))
    want = b.trunc(b.lshr(e, _c(32)), I32)
    left_id = b.load(b.gep(sym, [left]))
    right32 = b.load(b.gep(nxt, [left]))
    alive = b.and_(b.icmp_signed(">=", left_id, _c(0, I32)), b.icmp_signed(">=", right32, _c(0, I32)))
    check = b.append_basic_block("check")
    b.cbranch(alive, check, loop.cond)
    b.position_at_end(check)
    return left, left_id, b.sext(right32, I64), want


def _survivors(b: ir.IRBuilder, pops: ir.Value, pops_out: ir.Value,
               keep: Callable[[ir.Value, ir.Value], ir.Value]) -> None:
    """The loops' common end: walk the list from position 0 (never merged away: it is never a
    right); keep(p, o) writes survivor p as output o and returns the next position (-1: none).
    Then store the pop count and return the number of survivors."""
    out, pos = b.alloca(I64), b.alloca(I64)
    b.store(_c(0), out)
    b.store(_c(0), pos)
    loop = _Loop(b, "compact")
    loop.test(b.icmp_signed(">=", b.load(pos), _c(0)))
    p = b.load(pos)
    o = b.load(out)
    following = keep(p, o)
    b.store(b.add(o, _c(1)), out)
    b.store(following, pos)
    loop.close()
    b.store(b.load(pops), b.gep(pops_out, [_c(0)]))
    b.ret(b.load(out))


def build_merge_ir() -> str:
    module = ir.Module(name="merge")
    lookup, push, pop = _lookup(module), _push(module), _pop(module)
    p32, p64 = I32.as_pointer(), I64.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [p32, I64, p64, p32, p32, I64, p32, p32, p64, p64]),
                     name="merge")
    sym, n, keys, prio, merged, n_pairs, nxt, prv, heap, pops_out = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    size, pops, i = b.alloca(I64), b.alloca(I64), b.alloca(I64)
    b.store(_c(0), size)
    b.store(_c(0), pops)

    def at32(arr: ir.Value, idx: ir.Value) -> ir.Value:
        return b.gep(arr, [idx])

    def pair_key(left_id: ir.Value, right_id: ir.Value) -> ir.Value:
        return b.or_(b.shl(b.zext(left_id, I64), _c(32)), b.zext(right_id, I64))

    def push_pair(left_pos: ir.Value, right_pos: ir.Value) -> None:
        """Queue the pair (left_pos, right_pos) if it can merge."""
        j = b.call(lookup, [keys, n_pairs, pair_key(b.load(at32(sym, left_pos)),
                                                      b.load(at32(sym, right_pos)))])
        with b.if_then(b.icmp_signed(">=", j, _c(0))):
            pr = b.zext(b.load(at32(prio, j)), I64)
            b.call(push, [heap, size, b.or_(b.shl(pr, _c(32)), left_pos)])

    _link_and_queue(b, i, n, nxt, prv, push_pair)

    # the merge loop
    loop = _Loop(b, "merge")
    loop.test(b.icmp_signed(">", b.load(size), _c(0)))
    left, left_id, right, want = _next_pair(b, loop, pop, heap, size, pops, sym, nxt)
    j = b.call(lookup, [keys, n_pairs, pair_key(left_id, b.load(at32(sym, right)))])
    valid = b.append_basic_block("valid")
    found = b.icmp_signed(">=", j, _c(0))
    jj = b.select(found, j, _c(0))
    same = b.and_(found, b.icmp_signed("==", b.load(at32(prio, jj)), want))
    b.cbranch(same, valid, loop.cond)
    b.position_at_end(valid)
    b.store(b.load(at32(merged, jj)), at32(sym, left))
    b.store(_c(-1, I32), at32(sym, right))
    _unlink_and_requeue(b, left, right, nxt, prv, push_pair)
    loop.close()

    def keep(p: ir.Value, o: ir.Value) -> ir.Value:  # the survivors' ids, moved to the front
        b.store(b.load(at32(sym, p)), at32(sym, o))
        return b.sext(b.load(at32(nxt, p)), I64)

    _survivors(b, pops, pops_out, keep)
    return str(module)


class PairTable:
    """The mergeable pairs of one vocabulary, as the kernel reads them."""

    def __init__(self, left: np.ndarray, right: np.ndarray, prio: np.ndarray,
                 merged: np.ndarray) -> None:
        """Parallel int arrays, one row per pair; for a pair listed twice the first row wins."""
        keys = (left.astype(np.int64) << 32) | right.astype(np.int64)
        keys, first = np.unique(keys, return_index=True)  # sorted; index of the first occurrence
        self.keys = np.ascontiguousarray(keys, dtype=np.int64)
        self.prio = np.ascontiguousarray(prio[first], dtype=np.int32)
        self.merged = np.ascontiguousarray(merged[first], dtype=np.int32)


_PTR, _COUNT = ctypes.c_void_p, ctypes.c_int64  # the kernels' argument types
_lock = threading.Lock()
_kernels: dict[str, CFunction] = {}


def _kernel(name: str, build: Callable[[], str], *argtypes: type) -> CFunction:
    """The i64 function `name` of the module build() writes, compiled (or read from the disk
    cache) the first time it is asked for."""
    with _lock:
        fn = _kernels.get(name)
        if fn is None:
            lib: CompiledLibrary = compile_cached(name, (), build)
            fn = _kernels[name] = lib.function(name, ctypes.c_int64, *argtypes)
        return fn


def _merge_fn() -> CFunction:
    return _kernel("merge", build_merge_ir, _PTR, _COUNT, _PTR, _PTR, _PTR, _COUNT, _PTR, _PTR,
                   _PTR, _PTR)


def merge(symbols: np.ndarray, table: PairTable) -> tuple[np.ndarray, int]:
    """int32 symbol ids -> (merged ids, heap pops). The compiled twin of tokenizer.merge's loops."""
    sym = np.array(symbols, dtype=np.int32)  # a copy: the kernel merges in place
    n = len(sym)
    if n < 2 or len(table.keys) == 0:
        return sym, 0
    nxt = np.empty(n, np.int32)
    prv = np.empty(n, np.int32)
    heap = np.empty(3 * n + 1, np.int64)
    pops = np.zeros(1, np.int64)
    count = _merge_fn()(sym.ctypes.data, n, table.keys.ctypes.data, table.prio.ctypes.data,
                        table.merged.ctypes.data, len(table.keys), nxt.ctypes.data,
                        prv.ctypes.data, heap.ctypes.data, pops.ctypes.data)
    return sym[:count], int(pops[0])
