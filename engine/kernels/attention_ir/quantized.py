"""attention_<k>_<v>_<head_dim>: attention that reads q8_0 / q4_0 KV rows directly, as llama.cpp's
CPU flash attention's one-row path does for a quantized cache (engine.kernels.attention_quantized_reference
is its twin and says what it computes). One function per head_dim (a multiple of 32), so every
loop over a row is unrolled.

Like attention_f16acc, the query heads of one kv head (a run of up to GROUP_MAX items) take the
keys together, BLOCK_KEYS at a time, each head with its own quantized query, max, sum and
accumulator, so its bits do not depend on the company it keeps:

    qq, dq = q8_0(q row)            per head, into scratch: the quants as floats, the f16 scales
    per block of keys:
      a. scores, as llama.cpp's AVX2 block dot takes them: per key and block eight lanes of
         four consecutive products (integers, exact), acc = fma(d_k * d_q, lanes, acc) block
         by block, then ggml's hsum_float_8 of acc; s = scale * that
      b. the softmax factors ms, vs of attention_f16acc (block_softmax: the sequential online
         softmax's, one vector exp per 16 keys)
      c. acc = acc * ms (only at keys that set a new max), acc += (d_v * v quants) * vs, the
         accumulators in registers across the block, f32 (no rounding: V is not f16)
    out = acc * (1 / l)

The value rows are converted once per run; the next block's key rows and this block's value
rows are prefetched while the scores run. Rows: [n_ctx, n_kv_head, row_bytes].
"""
from __future__ import annotations

import math

from llvmlite import ir

from engine.kernels.attention_ir.f16acc import block_softmax, prefetch, vectors_per_pass
from engine.kernels.attention_ir.facts import BLOCK_KEYS, GROUP_MAX, PREFETCH_KEYS
from engine.kernels.attention_ir.items import min_i64, runs_of_heads
from engine.kernels.ir import builder
from engine.kernels.ir.builder import (
    F32,
    F32P,
    I16,
    I32,
    I64,
    const,
    counted_loop,
    fmuladd,
    gep,
    i64,
    load,
    store,
    variable,
)

I8 = ir.IntType(8)
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}
LANES = 16  # a block of 32 values is two <16 x float>
V16F32 = ir.VectorType(F32, LANES)
V16I8 = ir.VectorType(I8, LANES)
HALF = ir.HalfType()


def function_name(type_k: str, type_v: str, head_dim: int) -> str:
    return f"attention_{type_k}_{type_v}_{head_dim}"


def keys_per_group(head_dim: int) -> int:
    """Keys whose scores one loop step takes (their rows prefetched together)."""
    return 4 if head_dim <= 128 else 1


def scratch_floats(head_dim: int) -> int:
    """Per thread: for each head of a run its query's quants (head_dim), scales (head_dim / 32)
    and its block's scores, rescale and value factors (BLOCK_KEYS each)."""
    return GROUP_MAX * (head_dim + head_dim // 32 + 3 * BLOCK_KEYS)


def _scale_splat(b: ir.IRBuilder, block: ir.Value, lanes: int) -> ir.Value:
    """A block's f16 scale (its first two bytes) in every lane of a <lanes x float>, spelled as
    a splat of the i16 (vpbroadcastw + vcvtph2ps): a scalar half load becomes vpinsrw, which
    waits for whatever register it merges into, often an accumulator (ir.vectors.f16_splat)."""
    bits = b.load(b.bitcast(block, I16.as_pointer()), align=1)
    wide = builder.splat(b, bits, lanes)
    return b.fpext(b.bitcast(wide, ir.VectorType(HALF, lanes)), ir.VectorType(F32, lanes))


def _scale(b: ir.IRBuilder, block: ir.Value) -> ir.Value:
    """A block's f16 scale as a float."""
    return b.extract_element(_scale_splat(b, block, 8), ir.Constant(I32, 0))


def _values(b: ir.IRBuilder, block: ir.Value, half: int, qtype: str) -> ir.Value:
    """Values 16 * half .. 16 * half + 15 of a block's quants as <16 x float> (q4_0's less 8)."""
    if qtype == "q8_0":
        raw = b.load(b.bitcast(gep(b, block, i64(2 + 16 * half)), V16I8.as_pointer()), align=1)
        return b.sitofp(raw, V16F32)
    raw = b.load(b.bitcast(gep(b, block, i64(2)), V16I8.as_pointer()), align=1)
    nib = b.and_(raw, const(V16I8, 15)) if half == 0 else b.lshr(raw, const(V16I8, 4))
    return b.fsub(b.uitofp(nib, V16F32), const(V16F32, 8.0))


def define_quantized(module: ir.Module, type_k: str, type_v: str, head_dim: int,
                     registers: int = 16) -> None:
    """void f(q, k, v, out, scratch, n_q, n_head, n_kv_head, head_dim, pos0, scale, w_begin,
    w_end, window, ring): the f16 functions' signature (engine.kernels.attention_ir.items, no
    softcap) with k and v byte pointers to ggml-block rows; the head_dim argument must be the
    one the function was built for. registers: the vector registers the accumulation plans
    for (no result depends on it)."""
    if head_dim <= 0 or head_dim % 32 or head_dim > 512:
        raise ValueError(f"a quantized KV row needs a head_dim that is a multiple of 32 up to 512, got {head_dim}")
    i8p = I8.as_pointer()
    b, args = builder.define(module, function_name(type_k, type_v, head_dim), ir.VoidType(), [
        ("q", F32P), ("k", i8p), ("v", i8p), ("out", F32P), ("scratch", F32P),
        ("n_q", I64), ("n_head", I64), ("n_kv_head", I64), ("head_dim", I64), ("pos0", I64),
        ("scale", F32), ("w_begin", I64), ("w_end", I64), ("window", I64), ("ring", I64)])
    q, k, v, out, scratch, _n_q, n_head, n_kv_head, _hd, pos0, scale, w_begin, w_end, \
        window, ring = args
    nb = head_dim // 32
    bk, bv = BLOCK_BYTES[type_k], BLOCK_BYTES[type_v]
    k_stride, v_stride = b.mul(n_kv_head, i64(nb * bk)), b.mul(n_kv_head, i64(nb * bv))
    group = b.sdiv(n_head, n_kv_head)
    n_vec = head_dim // LANES
    per_group = keys_per_group(head_dim)

    def heads(w: ir.Value, n: int) -> None:
        """Items w .. w + n - 1: one query, consecutive heads of one kv head, in one pass."""
        query, kv_head = b.sdiv(w, n_head), b.sdiv(b.srem(w, n_head), group)
        n_all = b.add(b.add(pos0, query), i64(1))
        clipped = b.and_(b.icmp_signed(">", window, i64(0)), b.icmp_signed(">", n_all, window))
        n_keys = b.select(clipped, window, n_all)
        first = b.urem(b.sub(n_all, n_keys), ring)  # consecutive rows after it (engine.kv's mirror)
        k_head = gep(b, k, b.add(b.mul(first, k_stride), b.mul(kv_head, i64(nb * bk))))
        v_head = gep(b, v, b.add(b.mul(first, v_stride), b.mul(kv_head, i64(nb * bv))))
        q_rows = [gep(b, q, b.mul(b.add(w, i64(j)), i64(head_dim))) for j in range(n)]
        out_rows = [gep(b, out, b.mul(b.add(w, i64(j)), i64(head_dim))) for j in range(n)]
        qq_rows = [gep(b, scratch, i64(j * head_dim)) for j in range(n)]
        dq_rows = [gep(b, scratch, i64(GROUP_MAX * head_dim + j * nb)) for j in range(n)]
        factors = GROUP_MAX * (head_dim + nb)
        score_rows, ms_rows, vs_rows = ([gep(b, scratch, i64(factors + (a * GROUP_MAX + j) * BLOCK_KEYS))
                                         for j in range(n)] for a in range(3))

        # each head's query to q8_0: d = max|x| / 127, quants rint(x * 127 / max|x|) (0 for a
        # zero block); read before out is zeroed (q may be out)
        rint = builder.intrinsic(b, "llvm.rint", V16F32, 1)
        for j in range(n):
            for blk in range(nb):
                xs = [load(b, q_rows[j], i64(32 * blk + LANES * i), V16F32) for i in range(2)]
                mags = [builder.maxnum(b, x, b.fsub(const(V16F32, 0.0), x)) for x in xs]
                amax = builder.hmax(b, builder.maxnum(b, mags[0], mags[1]))
                nonzero = b.fcmp_ordered("!=", amax, const(F32, 0.0))
                inv = b.select(nonzero, b.fdiv(const(F32, 127.0), amax), const(F32, 0.0))
                for i, x in enumerate(xs):
                    store(b, b.call(rint, [b.fmul(x, builder.splat(b, inv, LANES))]), qq_rows[j],
                          i64(32 * blk + LANES * i))
                d = b.fdiv(amax, const(F32, 127.0))
                store(b, b.fpext(b.fptrunc(d, HALF), F32), dq_rows[j], i64(blk))
        for j in range(n):
            for c in range(n_vec):
                store(b, const(V16F32, 0.0), out_rows[j], i64(LANES * c))
        m_run = [variable(b, F32, const(F32, -math.inf), f"m{j}") for j in range(n)]
        l_run = [variable(b, F32, const(F32, 0.0), f"l{j}") for j in range(n)]

        def row(head: ir.Value, stride: ir.Value, t: ir.Value) -> ir.Value:
            return gep(b, head, b.mul(t, stride))

        def prefetch_rows(head: ir.Value, stride: ir.Value, first_row: ir.Value, count: int,
                          row_bytes: int) -> None:
            for r in range(count):
                at = row(head, stride, min_i64(b, b.add(first_row, i64(r)), b.sub(n_keys, i64(1))))
                for off in range(0, row_bytes, 64):
                    prefetch(b, gep(b, at, i64(off)))
                prefetch(b, gep(b, at, i64(row_bytes - 1)))

        def scores(t0: ir.Value, r: ir.Value, keys: int) -> None:
            """score_rows[j][r .. r + keys - 1] for every head j, of keys t0 + r .. . Per key
            and block, ggml's eight lanes of four consecutive products (exact integers), then
            acc = fma(d_k * d_q, lanes, acc) block by block and its hsum_float_8 (the order of
            llama.cpp's AVX2 vec_dot_q8_0_q8_0 / q4_0_q8_0)."""
            rows = [row(k_head, k_stride, b.add(b.add(t0, r), i64(i))) for i in range(keys)]
            quants = [[[_values(b, gep(b, kr, i64(blk * bk)), h, type_k) for h in range(2)]
                       for blk in range(nb)] for kr in rows]
            dk = [[_scale(b, gep(b, kr, i64(blk * bk))) for blk in range(nb)] for kr in rows]
            for j in range(n):
                qv = [[load(b, qq_rows[j], i64(32 * blk + LANES * h), V16F32) for h in range(2)]
                      for blk in range(nb)]
                dq = [load(b, dq_rows[j], i64(blk)) for blk in range(nb)]
                for i in range(keys):
                    acc = None
                    for blk in range(nb):
                        pa = b.fmul(qv[blk][0], quants[i][blk][0])
                        pb = b.fmul(qv[blk][1], quants[i][blk][1])
                        x = [builder.shuffle(b, pa, pb, [4 * lane + e for lane in range(8)]) for e in range(4)]
                        lanes = b.fadd(b.fadd(x[0], x[1]), b.fadd(x[2], x[3]))  # <8 x float>
                        dd = builder.splat(b, b.fmul(dk[i][blk], dq[blk]))
                        acc = b.fmul(dd, lanes) if acc is None else fmuladd(b, dd, lanes, acc)
                    assert acc is not None
                    store(b, b.fmul(builder.hsum(b, acc), scale), score_rows[j], b.add(r, i64(i)))

        def accumulate(t0: ir.Value, count: ir.Value, new_keys: ir.Value) -> None:
            """acc = acc * ms (keys with a bit in new_keys), acc += (d_v * v) * vs, key by key,
            per_pass vectors of every head's accumulator in registers across the block."""
            per_pass = vectors_per_pass(n, LANES, registers)
            for c0 in range(0, n_vec, per_pass):
                cs = list(range(c0, min(c0 + per_pass, n_vec)))
                accs = [[variable(b, V16F32, load(b, out_rows[j], i64(LANES * c), V16F32), f"acc{j}_{c}")
                         for c in cs] for j in range(n)]
                with counted_loop(b, i64(0), count, 1, "ak") as r:
                    vr = row(v_head, v_stride, b.add(t0, r))
                    vals = []
                    for c in cs:
                        block = gep(b, vr, i64((c // 2) * bv))
                        vals.append(b.fmul(_scale_splat(b, block, LANES), _values(b, block, c % 2, type_v)))
                    is_new = b.trunc(b.lshr(new_keys, r), ir.IntType(1))
                    with b.if_then(is_new, likely=False):
                        for j in range(n):
                            msv = builder.splat(b, load(b, ms_rows[j], r), LANES)
                            for acc in accs[j]:
                                b.store(b.fmul(b.load(acc), msv), acc)
                    for j in range(n):
                        vsv = builder.splat(b, load(b, vs_rows[j], r), LANES)
                        for acc, value in zip(accs[j], vals):
                            b.store(fmuladd(b, value, vsv, b.load(acc)), acc)
                for j in range(n):
                    for c, acc in zip(cs, accs[j]):
                        store(b, b.load(acc), out_rows[j], i64(LANES * c))

        prefetch_rows(k_head, k_stride, i64(0), PREFETCH_KEYS, nb * bk)
        with counted_loop(b, i64(0), n_keys, BLOCK_KEYS, "blk") as t0:
            count = min_i64(b, b.sub(n_keys, t0), i64(BLOCK_KEYS))
            grouped = b.mul(b.sdiv(count, i64(per_group)), i64(per_group))
            with counted_loop(b, i64(0), grouped, per_group, "sg") as r:
                t = b.add(t0, r)
                prefetch_rows(k_head, k_stride, b.add(t, i64(BLOCK_KEYS)), per_group, nb * bk)
                prefetch_rows(v_head, v_stride, t, per_group, nb * bv)
                scores(t0, r, per_group)
            with counted_loop(b, grouped, count, 1, "s1") as r:
                scores(t0, r, 1)
            new_keys = block_softmax(b, n, count, score_rows, ms_rows, vs_rows, m_run, l_run)
            accumulate(t0, count, new_keys)

        for j in range(n):  # l >= 1: the max key adds 1; times 1 / l as ggml scales it
            inv_l = builder.splat(b, b.fdiv(const(F32, 1.0), b.load(l_run[j])), LANES)
            for c in range(n_vec):
                store(b, b.fmul(load(b, out_rows[j], i64(LANES * c), V16F32), inv_l), out_rows[j], i64(LANES * c))

    runs_of_heads(b, w_begin, w_end, n_head, group, heads)


def build_quantized_module(type_k: str, type_v: str, head_dim: int, registers: int = 16) -> ir.Module:
    module = builder.new_module(function_name(type_k, type_v, head_dim))
    define_quantized(module, type_k, type_v, head_dim, registers)
    return module
