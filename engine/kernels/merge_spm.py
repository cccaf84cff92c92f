"""SentencePiece's merge loop, compiled: engine.tokenizer.merge.spm_merge on the text's bytes.

    spm_merge(text, SpmVocab(texts, scores)) -> ([(token id or -1, first character)], heap pops)

The loop is engine/kernels/merge.py's (the same heap of (priority << 32 | left position), the
same "act only if the pair there still has this priority" rule), but an SPM vocabulary has no
merge list: a pair merges when its joined text is a token. A symbol is a span of the text, so
"is text[a:e] a token?" is asked of a hash table: the span's polynomial hash (mod 2^64) comes
from the text's prefix hashes in O(1), is looked up by binary search among the sorted token
hashes, and the bytes are compared, so a hash collision can never change a result. Building
SpmVocab for 262k tokens takes ~0.3 s (numpy), paid by the first long text, not at load.

Why compiled: the Python loop costs ~4 us per merge (string joins, dict lookups): 64 KiB of
English took ~320 ms on Gemma 3's vocabulary; here ~20 ms.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from engine.kernels.jit import CFunction
from engine.kernels.merge import (
    _COUNT,
    _PTR,
    BOOL,
    I32,
    I64,
    _c,
    _kernel,
    _link_and_queue,
    _Loop,
    _lower_bound,
    _next_pair,
    _pop,
    _push,
    _survivors,
    _unlink_and_requeue,
)


def _same_bytes(module: ir.Module) -> ir.Function:
    """i1 same(a*, b*, n): the n bytes at a equal those at b."""
    p8 = ir.IntType(8).as_pointer()
    fn = ir.Function(module, ir.FunctionType(BOOL, [p8, p8, I64]), name="same_bytes")
    fn.linkage = "internal"
    a, c, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    i = b.alloca(I64)
    b.store(_c(0), i)
    loop = _Loop(b, "cmp")
    loop.test(b.icmp_signed("<", b.load(i), n))
    k = b.load(i)
    differ = b.icmp_unsigned("!=", b.load(b.gep(a, [k])), b.load(b.gep(c, [k])))
    cont = b.append_basic_block("next")
    fail = b.append_basic_block("fail")
    b.cbranch(differ, fail, cont)
    b.position_at_end(fail)
    b.ret(_c(0, BOOL))
    b.position_at_end(cont)
    b.store(b.add(k, _c(1)), i)
    loop.close()
    b.ret(_c(1, BOOL))
    return fn


def _token_at(module: ir.Module, same: ir.Function) -> ir.Function:
    """i64 token_at(hashes*, ids*, n_tok, offs*, lens*, tbytes*, text*, H*, inv*, a, e): the id of
    the token whose bytes are text[a:e], or -1.

    The vocabulary: token hashes sorted ascending, the token id of each, and each token's bytes
    (offset into tbytes, length). H and inv are the text's prefix hashes and inverse powers, so
    the span's hash is (H[e] - H[a]) * inv[a] (mod 2^64): the polynomial the token hashes use."""
    p8, p32, p64 = ir.IntType(8).as_pointer(), I32.as_pointer(), I64.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [p64, p32, I64, p64, p32, p8, p8, p64, p64,
                                                   I64, I64]), name="token_at")
    fn.linkage = "internal"
    hashes, ids, n, offs, lens, tbytes, text, H, inv, a, e = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    h = b.mul(b.sub(b.load(b.gep(H, [e])), b.load(b.gep(H, [a]))), b.load(b.gep(inv, [a])))
    lo = _lower_bound(b, hashes, n, h)
    length = b.sub(e, a)
    scan = _Loop(b, "equal")  # every token with this hash (a true collision is rare, not wrong)
    k = b.load(lo)
    inside = b.icmp_signed("<", k, n)
    kk = b.select(inside, k, _c(0))
    scan.test(b.and_(inside, b.icmp_unsigned("==", b.load(b.gep(hashes, [kk])), h)))
    k = b.load(lo)
    t = b.sext(b.load(b.gep(ids, [k])), I64)
    fits = b.icmp_signed("==", b.sext(b.load(b.gep(lens, [t])), I64), length)
    check, nxt_bb, hit = (b.append_basic_block("verify"), b.append_basic_block("step"),
                          b.append_basic_block("hit"))
    b.cbranch(fits, check, nxt_bb)
    b.position_at_end(check)
    eq = b.call(same, [b.gep(tbytes, [b.load(b.gep(offs, [t]))]), b.gep(text, [a]), length])
    b.cbranch(eq, hit, nxt_bb)
    b.position_at_end(hit)
    b.ret(t)
    b.position_at_end(nxt_bb)
    b.store(b.add(k, _c(1)), lo)
    scan.close()
    b.ret(_c(-1))
    return fn


def build_spm_ir() -> str:
    """i64 spm(n, cstart*, text*, H*, inv*, hashes*, ids*, n_tok, offs*, lens*, tbytes*, prio*,
               sym*, nxt*, prv*, heap*, pops*)

    SentencePiece's merge over the n characters of `text` (UTF-8; character i is the bytes
    [cstart[i], cstart[i + 1])): the adjacent pair whose joined bytes are a token with the
    best priority (prio[token]: the score's rank, 0 = highest) merges first, leftmost on ties.
    Out: sym[0:result] the surviving symbols' token ids (-1: a character no token covers) and
    nxt[0:result] their first character's index."""
    module = ir.Module(name="spm")
    push, pop = _push(module), _pop(module)
    token_at = _token_at(module, _same_bytes(module))
    p8, p32, p64 = ir.IntType(8).as_pointer(), I32.as_pointer(), I64.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [I64, p64, p8, p64, p64, p64, p32, I64, p64, p32,
                                                   p8, p32, p32, p32, p32, p64, p64]), name="spm")
    (n, cstart, text, H, inv, hashes, ids, n_tok, offs, lens, tbytes, prio, sym, nxt, prv, heap,
     pops_out) = fn.args
    vocab = [hashes, ids, n_tok, offs, lens, tbytes]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    size, pops, i = b.alloca(I64), b.alloca(I64), b.alloca(I64)
    b.store(_c(0), size)
    b.store(_c(0), pops)

    def start(pos: ir.Value) -> ir.Value:
        return b.load(b.gep(cstart, [pos]))

    def end_of(right: ir.Value) -> ir.Value:
        after = b.sext(b.load(b.gep(nxt, [right])), I64)
        return start(b.select(b.icmp_signed(">=", after, _c(0)), after, n))

    def pair_token(left: ir.Value, right: ir.Value) -> ir.Value:
        return b.call(token_at, [*vocab, text, H, inv, start(left), end_of(right)])

    def push_pair(left: ir.Value, right: ir.Value) -> None:
        t = pair_token(left, right)
        with b.if_then(b.icmp_signed(">=", t, _c(0))):
            pr = b.zext(b.load(b.gep(prio, [t])), I64)
            b.call(push, [heap, size, b.or_(b.shl(pr, _c(32)), left)])

    def alive(k: ir.Value) -> None:
        b.store(_c(0, I32), b.gep(sym, [k]))  # the ids are filled in at the end

    _link_and_queue(b, i, n, nxt, prv, push_pair, each=alive)

    loop = _Loop(b, "merge")
    loop.test(b.icmp_signed(">", b.load(size), _c(0)))
    left, _, right, want = _next_pair(b, loop, pop, heap, size, pops, sym, nxt)
    t = pair_token(left, right)
    found = b.icmp_signed(">=", t, _c(0))
    same = b.and_(found, b.icmp_signed("==", b.load(b.gep(prio, [b.select(found, t, _c(0))])), want))
    valid = b.append_basic_block("valid")
    b.cbranch(same, valid, loop.cond)
    b.position_at_end(valid)
    b.store(_c(-2, I32), b.gep(sym, [right]))  # merged away
    _unlink_and_requeue(b, left, right, nxt, prv, push_pair)
    loop.close()

    def keep(p: ir.Value, o: ir.Value) -> ir.Value:
        """Survivor p's token id (or -1) into sym[o], its first character into nxt[o] (o <= p)."""
        following = b.sext(b.load(b.gep(nxt, [p])), I64)
        stop = start(b.select(b.icmp_signed(">=", following, _c(0)), following, n))
        t = b.call(token_at, [*vocab, text, H, inv, start(p), stop])
        b.store(b.trunc(t, I32), b.gep(sym, [o]))
        b.store(b.trunc(p, I32), b.gep(nxt, [o]))
        return following

    _survivors(b, pops, pops_out, keep)
    return str(module)


_P = 0x9E3779B97F4A7C15                      # odd, so invertible mod 2^64
_P_INV = pow(_P, -1, 1 << 64)


def _powers(base: int, n: int) -> np.ndarray:
    """uint64 [n]: base^0, base^1, ... (mod 2^64; numpy's integer products wrap)."""
    out = np.full(n, base, dtype=np.uint64)
    if n:
        out[0] = 1
    return np.cumprod(out, dtype=np.uint64)


def _prefix_hashes(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(H, inv) of a uint8 buffer: H[k] = sum_{j<k} data[j] * P^j, inv[k] = P^-k (mod 2^64)."""
    with np.errstate(over="ignore"):
        H = np.zeros(len(data) + 1, dtype=np.uint64)
        np.cumsum(data.astype(np.uint64) * _powers(_P, len(data)), out=H[1:])
        return H, _powers(_P_INV, len(data) + 1)


class SpmVocab:
    """A SentencePiece vocabulary as the compiled merge reads it: token hashes (sorted), each
    token's bytes, and its priority (the rank of its score, 0 = highest; equal scores tie)."""

    def __init__(self, texts: list[str], scores: list[float]) -> None:
        encoded = [t.encode("utf-8") for t in texts]
        lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        self.tbytes = np.frombuffer(b"".join(encoded) or b"\0", dtype=np.uint8)
        self.offs = np.zeros(len(encoded), dtype=np.int64)
        np.cumsum(lens[:-1], out=self.offs[1:])
        # each token's hash, sum of byte_i * P^i: powers by position within the token, summed
        # per token (the vocabulary has no empty token: the tokenizer renames those)
        within = np.arange(len(self.tbytes)) - np.repeat(self.offs, lens)
        with np.errstate(over="ignore"):
            terms = self.tbytes.astype(np.uint64) * _powers(_P, int(lens.max(initial=1)))[within]
            h = np.add.reduceat(terms, self.offs) if len(encoded) else np.zeros(0, np.uint64)
        order = np.argsort(h, kind="stable")
        self.hashes = np.ascontiguousarray(h[order]).view(np.int64)
        self.ids = order.astype(np.int32)
        self.lens = lens.astype(np.int32)
        s = np.asarray(scores, dtype=np.float64)
        _, rank = np.unique(-s, return_inverse=True)  # 0 = the highest score; ties share a rank
        self.prio = rank.astype(np.int32)


def _spm_fn() -> CFunction:
    p, n = _PTR, _COUNT
    return _kernel("spm", build_spm_ir, n, p, p, p, p, p, p, n, p, p, p, p, p, p, p, p, p)


def spm_merge(text: str, vocab: SpmVocab) -> tuple[list[tuple[int, int]], int]:
    """SentencePiece's merge of `text`: [(token id or -1, index of its first character)] and the
    heap pops it took. The compiled twin of engine.tokenizer.merge.spm_merge."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    starts = np.flatnonzero((data & 0xC0) != 0x80)  # the first byte of each character
    n = len(starts)
    if n == 0:
        return [], 0
    cstart = np.empty(n + 1, dtype=np.int64)
    cstart[:n] = starts
    cstart[n] = len(data)
    H, inv = _prefix_hashes(data)
    sym, nxt, prv = np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32)
    heap = np.empty(3 * n + 1, np.int64)
    pops = np.zeros(1, np.int64)
    v = vocab
    count = _spm_fn()(n, cstart.ctypes.data, data.ctypes.data, H.ctypes.data, inv.ctypes.data,
                      v.hashes.ctypes.data, v.ids.ctypes.data, len(v.ids), v.offs.ctypes.data,
                      v.lens.ctypes.data, v.tbytes.ctypes.data, v.prio.ctypes.data,
                      sym.ctypes.data, nxt.ctypes.data, prv.ctypes.data, heap.ctypes.data,
                      pops.ctypes.data)
    return list(zip(sym[:count].tolist(), nxt[:count].tolist())), int(pops[0])
