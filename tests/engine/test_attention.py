"""The compiled attention kernel against its float64 numpy twin and against itself."""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from engine.kernels.attention import AttentionKernel
from engine.kernels.attention_ir import (
    DEEP_CACHE,
    DEEP_MIN_QUERIES,
    TILED_MIN_QUERIES,
    blocked_scratch_floats,
    exact_scratch_floats,
    f16acc_scratch_floats,
)
from engine.kernels.attention_reference import (
    attention_exact,
    attention_f16acc_reference,
    attention_reference,
)

# The kernel and its twin keep the accumulator f16-rounded after every key (llama.cpp's order);
# float32 differences in a dot product or exp can move one rounding by an f16 ulp of the
# accumulator (2^-9 at |acc| ~ 2-4 for these N(0, 1) values), which later keys carry along.
RTOL, ATOL = 2e-3, 1e-3


@pytest.fixture(scope="module")
def kernels() -> Iterator[dict[int, AttentionKernel]]:
    one, two = AttentionKernel(1), AttentionKernel(2)
    two.parallel_min_work = 0  # split even the small test problems across both threads
    yield {1: one, 2: two}
    two.close()


def make_case(rng: np.random.Generator, n_q: int, pos0: int, n_head: int, n_kv_head: int,
              head_dim: int, n_ctx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = rng.standard_normal((n_q, n_head, head_dim)).astype(np.float32)       # [n_q, n_head, head_dim]
    k = rng.standard_normal((n_ctx, n_kv_head, head_dim)).astype(np.float16)  # [n_ctx, n_kv_head, head_dim]
    v = rng.standard_normal((n_ctx, n_kv_head, head_dim)).astype(np.float16)
    # rows past the sequence are poison: any read of them would turn the output into NaN
    k[pos0 + n_q:] = np.nan
    v[pos0 + n_q:] = np.nan
    return q, k, v


CASES = {
    "decode-long-cache": (1, 900, 1024),
    "prefill": (37, 0, 40),
    "prefill-chunk": (37, 20, 64),
    "prefill-tiled": (70, 0, 80),        # >= TILED_MIN_QUERIES: the exact f32 function
    "prefill-tiled-chunk": (66, 30, 100),
}


def test_path_switch_follows_llama_cpp(kernels):
    """Below TILED_MIN_QUERIES queries the f16 accumulator is used, from it on exact f32."""
    for n_q in (TILED_MIN_QUERIES - 1, TILED_MIN_QUERIES):
        q, k, v = make_case(np.random.default_rng(n_q), n_q, 0, 4, 2, 64, n_q)
        got = kernels[1](q, k, v, 0)
        exact, f16acc = attention_exact(q, k, v, 0), attention_f16acc_reference(q, k, v, 0)
        near, far = (f16acc, exact) if n_q < TILED_MIN_QUERIES else (exact, f16acc)
        assert np.abs(got - near).mean() < 0.1 * np.abs(got - far).mean()


def test_a_chunk_over_a_deep_cache_takes_the_tiles(kernels):
    """From DEEP_CACHE cached rows, DEEP_MIN_QUERIES queries already run the f32 tiles (exact's
    softmax); one fewer query, or one fewer cached row, stays on the f16 accumulator."""
    for n_q, pos0, tiled in [(DEEP_MIN_QUERIES, DEEP_CACHE, True),
                             (DEEP_MIN_QUERIES - 1, DEEP_CACHE, False),
                             (DEEP_MIN_QUERIES, DEEP_CACHE - 1, False)]:
        q, k, v = make_case(np.random.default_rng(n_q + pos0), n_q, pos0, 4, 2, 64, pos0 + n_q)
        got = kernels[2](q, k, v, pos0)
        exact, f16acc = attention_exact(q, k, v, pos0), attention_f16acc_reference(q, k, v, pos0)
        near, far = (exact, f16acc) if tiled else (f16acc, exact)
        assert np.abs(got - near).mean() < 0.1 * np.abs(got - far).mean(), (n_q, pos0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("head_dim", [64, 72, 128])  # 72: the 8-lane accumulate pass
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_numpy_twin(kernels, case, group, head_dim, threads):
    n_q, pos0, n_ctx = CASES[case]
    n_kv_head = 2
    rng = np.random.default_rng([n_q, pos0, group, head_dim])
    q, k, v = make_case(rng, n_q, pos0, n_kv_head * group, n_kv_head, head_dim, n_ctx)
    got = kernels[threads](q, k, v, pos0)
    assert got.shape == q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, attention_reference(q, k, v, pos0), rtol=RTOL, atol=ATOL)


def test_threads_give_identical_results(kernels):
    q, k, v = make_case(np.random.default_rng(1), 29, 11, 9, 3, 64, 48)
    assert np.array_equal(kernels[1](q, k, v, 11), kernels[2](q, k, v, 11))


def test_fewer_items_than_threads(kernels):
    """One (query, head) item over two threads: one thread gets nothing to do."""
    q, k, v = make_case(np.random.default_rng(4), 1, 6, 1, 1, 64, 8)
    assert np.array_equal(kernels[2](q, k, v, 6), kernels[1](q, k, v, 6))


@pytest.mark.parametrize("n", [TILED_MIN_QUERIES - 1, TILED_MIN_QUERIES + 21])
def test_prefill_equals_token_by_token_decode(kernels, n):
    """Query i of a prefill must see exactly what a decode step at position i sees: the same
    bits on the one-row path, within the decode's f16 accumulator on the tiles (f32)."""
    n_head, n_kv_head, head_dim = 6, 2, 64
    q, k, v = make_case(np.random.default_rng(2), n, 0, n_head, n_kv_head, head_dim, n)
    batched = kernels[1](q, k, v, 0)
    tol = (1e-6, 1e-7) if n < TILED_MIN_QUERIES else (0.0, 5e-3)  # f16: 2^-11 of outputs up to ~4
    for i in range(n):
        step = kernels[1](q[i:i + 1].copy(), k, v, i)
        np.testing.assert_allclose(step[0], batched[i], rtol=tol[0], atol=tol[1])


def test_future_keys_do_not_leak(kernels):
    n_q, pos0 = 8, 5
    q, k, v = make_case(np.random.default_rng(3), n_q, pos0, 4, 2, 64, 16)
    before = kernels[1](q, k, v, pos0)
    k2, v2 = k.copy(), v.copy()
    k2[pos0 + 4:pos0 + n_q] *= -3  # rows only queries 4.. may see
    v2[pos0 + 4:pos0 + n_q] += 1
    after = kernels[1](q, k2, v2, pos0)
    assert np.array_equal(before[:4], after[:4])
    assert not np.allclose(before[4:], after[4:])


# (n_head, n_kv_head): groups of 3, 4, 1, 6 and 16 (the last two longer than GROUP_MAX: several runs)
GROUPINGS = [(9, 3), (8, 2), (4, 4), (6, 1), (16, 1)]


# the three kernels: (queries, flash_attn); f16acc below TILED_MIN_QUERIES, blocked (exact's f32
# softmax, online in tiles) from there, rounded (llama.cpp without flash attention) at every size
PATHS = {"f16acc": (2, True), "blocked": (TILED_MIN_QUERIES, True), "rounded": (3, False)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("f16c", [True, False])
@pytest.mark.parametrize("head_dim", [64, 72])
@pytest.mark.parametrize("n_head,n_kv_head", GROUPINGS)
def test_heads_run_together_give_the_bits_of_one_head_at_a_time(n_head, n_kv_head, head_dim, f16c,
                                                                path):
    """Head h reads kv head h // (n_head // n_kv_head), and gets the same bits when the heads of
    its kv head run through the keys together as when it is the only head (a group of one)."""
    n_q, flash_attn = PATHS[path]
    kern = AttentionKernel(f16c=f16c, flash_attn=flash_attn)
    group = n_head // n_kv_head
    # 38 keys and up: blocks of four plus a tail of single keys; x3 makes new maxima
    q, k, v = make_case(np.random.default_rng([n_head, head_dim]), n_q, 37, n_head, n_kv_head,
                        head_dim, 37 + n_q)
    q *= 3
    got = kern(q, k, v, 37)
    for h in range(n_head):
        kv = slice(h // group, h // group + 1)
        single = kern(q[:, h:h + 1].copy(), k[:, kv].copy(), v[:, kv].copy(), 37)
        assert np.array_equal(got[:, h].view(np.uint32), single[:, 0].view(np.uint32)), h


@pytest.mark.parametrize("f16c", [True, False])
@pytest.mark.parametrize("head_dim", [64, 72, 128])
@pytest.mark.parametrize("n_head,n_kv_head", [(8, 2), (6, 1), (4, 4)])
def test_register_plans_give_the_same_bits(n_head, n_kv_head, head_dim, f16c):
    """The code planned for 16 or for 32 vector registers (how many keys share a pass over
    head_dim, how much of the accumulator stays in registers) gives identical bits: key counts
    around the BLOCK_KEYS edges, scores that rise key after key (a new max at every key, each
    with its rescale) and the same keys shuffled."""
    plans = [AttentionKernel(f16c=f16c, registers=r) for r in (16, 32)]
    rng = np.random.default_rng([n_head, head_dim])
    for pos0 in (0, 30, 31, 32, 33, 64, 100):
        q, k, v = make_case(rng, 1, pos0, n_head, n_kv_head, head_dim, pos0 + 1)
        q = np.abs(q)  # positive q and one positive key direction scaled up: rising scores
        rising = (np.abs(k[:1]) * np.linspace(0.05, 1.0, pos0 + 1)[:, None, None]).astype(np.float16)
        for keys in (k, rising, rising[rng.permutation(pos0 + 1)]):
            got = [kern(q, keys, v, pos0) for kern in plans]
            assert np.array_equal(got[0].view(np.uint32), got[1].view(np.uint32)), pos0
            np.testing.assert_allclose(got[0], attention_f16acc_reference(q, keys, v, pos0),
                                       rtol=RTOL, atol=ATOL)


def run_items(kern: AttentionKernel, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int,
              out: np.ndarray, w_begin: int, w_end: int, path: str = "f16acc") -> None:
    """One kernel function itself over items [w_begin, w_end), as one thread of a split runs it."""
    n_q, n_head, head_dim = q.shape
    if path == "f16acc":
        fn, floats = kern._f16acc, f16acc_scratch_floats(n_head, k.shape[1], head_dim)
    else:
        fn, floats = kern._blocked, max(exact_scratch_floats(pos0 + n_q, n_head, k.shape[1]),
                                        blocked_scratch_floats(head_dim))
    scratch = np.empty(floats, np.float32)
    fn(q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data, scratch.ctypes.data,
       n_q, n_head, k.shape[1], head_dim, pos0, 1 / math.sqrt(head_dim), w_begin, w_end,
       0, k.shape[0], 0.0)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("n_head,n_kv_head", GROUPINGS)
def test_item_ranges_that_cut_groups_give_the_same_bits(n_head, n_kv_head, path):
    """Ranges cut anywhere (mid-group, mid-run) write exactly their items, with the bits of the
    whole range: a run of heads ends at the range's edge without changing any head's result."""
    n_q, flash_attn = PATHS[path]
    kern = AttentionKernel(flash_attn=flash_attn)
    pos0, head_dim = 10, 64
    q, k, v = make_case(np.random.default_rng([n_head, 1]), n_q, pos0, n_head, n_kv_head, head_dim,
                        pos0 + n_q)
    n_items = n_q * n_head
    whole = np.full_like(q, np.nan)
    run_items(kern, q, k, v, pos0, whole, 0, n_items, path)
    assert np.array_equal(whole, kern(q, k, v, pos0))
    rng = np.random.default_rng(n_head)
    for _ in range(6):
        cuts = np.sort(rng.choice(np.arange(1, n_items), size=3, replace=False))
        out = np.full_like(q, np.nan)
        for lo, hi in zip([0, *cuts], [*cuts, n_items]):
            before = out.copy()
            run_items(kern, q, k, v, pos0, out, int(lo), int(hi), path)
            items, items_before = out.reshape(n_items, head_dim), before.reshape(n_items, head_dim)
            assert np.isnan(items[hi:]).all()
            assert np.array_equal(items[:lo], items_before[:lo], equal_nan=True)
        assert np.array_equal(out.view(np.uint32), whole.view(np.uint32)), cuts


def test_large_scores_stay_finite(kernels):
    """Scores in the thousands: without max subtraction exp overflows."""
    q, k, v = make_case(np.random.default_rng(5), 5, 60, 4, 4, 64, 80)
    q *= 300
    got = kernels[1](q, k, v, 60)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, attention_reference(q, k, v, 60), rtol=1e-4, atol=1e-4)


def test_scale_override_and_in_place_output(kernels):
    q, k, v = make_case(np.random.default_rng(6), 6, 2, 4, 2, 128, 8)
    want = attention_reference(q, k, v, 2, scale=0.3)
    got = kernels[1](q, k, v, 2, out=q, scale=0.3)
    assert got is q
    np.testing.assert_allclose(q, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("f16c", [True, False])
def test_every_f16_value_converts_exactly(f16c):
    """With one key, softmax is exactly 1 and out = v[0]: all 65536 f16 bit patterns."""
    kern = AttentionKernel(f16c=f16c)
    n_kv_head, head_dim = 1024, 64
    v = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(1, n_kv_head, head_dim)
    k = np.zeros_like(v)
    q = np.ones((1, n_kv_head, head_dim), np.float32)
    got = kern(q, k, v, 0)
    np.testing.assert_array_equal(got, v.astype(np.float32))


def test_portable_path_matches_twin():
    q, k, v = make_case(np.random.default_rng(7), 13, 7, 6, 3, 64, 24)
    got = AttentionKernel(f16c=False)(q, k, v, 7)
    np.testing.assert_allclose(got, attention_reference(q, k, v, 7), rtol=RTOL, atol=ATOL)


def test_empty_query_batch(kernels):
    q = np.zeros((0, 4, 64), np.float32)
    k = np.zeros((8, 2, 64), np.float16)
    assert kernels[1](q, k, k, 3).shape == (0, 4, 64)


@pytest.mark.parametrize("mutate,error", [
    (lambda q, k, v: (q.astype(np.float64), k, v, 0), TypeError),
    (lambda q, k, v: (q, k.astype(np.float32), v, 0), TypeError),
    (lambda q, k, v: (q[:, :, ::2], k, v, 0), TypeError),
    (lambda q, k, v: (q, k, v[:4], 0), ValueError),
    (lambda q, k, v: (q, k, v, 7), ValueError),     # 7 + 2 queries > 8 cache rows
    (lambda q, k, v: (q, k, v, -1), ValueError),
    (lambda q, k, v: (q, k, v, 1.5), TypeError),
    (lambda q, k, v: (q[:, :3].copy(), k, v, 0), ValueError),  # 3 heads over 2 kv heads
    (lambda q, k, v: (q[:, :, :12].copy(), k[:, :, :12].copy(), v[:, :, :12].copy(), 0), ValueError),
    (lambda q, k, v: (q[:, :, :32].copy(), k, v, 0), ValueError),
])
def test_bad_input_is_a_clear_error(kernels, mutate, error):
    q = np.zeros((2, 4, 64), np.float32)
    k = np.zeros((8, 2, 64), np.float16)
    with pytest.raises(error):
        kernels[1](*mutate(q, k, k.copy()))


def test_bad_out_and_threads():
    with pytest.raises(ValueError):
        AttentionKernel(0)
    q = np.zeros((1, 2, 64), np.float32)
    k = np.zeros((4, 1, 64), np.float16)
    with pytest.raises(ValueError):
        AttentionKernel()(q, k, k, 0, out=np.zeros((1, 2, 32), np.float32))


def test_twin_rounds_at_most_a_few_f16_ulps_apart_from_the_kernel(kernels):
    q, k, v = make_case(np.random.default_rng(9), 40, 0, 6, 2, 64, 40)
    got, want = kernels[1](q, k, v, 0), attention_reference(q, k, v, 0)
    diff = np.abs(got - want)
    assert diff.mean() < 1e-6  # float32 noise, with a rare f16 rounding flip
    assert diff.max() < 1e-3


def test_twin_is_softmax_attention_up_to_f16_accumulation():
    q, k, v = make_case(np.random.default_rng(10), 30, 5, 6, 2, 64, 40)
    np.testing.assert_allclose(attention_reference(q, k, v, 5), attention_exact(q, k, v, 5),
                               rtol=5e-3, atol=5e-3)


def test_exact_reference_is_softmax_attention():
    """The float64 reference itself, for one head, written out the textbook way."""
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 1, 8)).astype(np.float32)
    k = rng.standard_normal((3, 1, 8)).astype(np.float16)
    v = rng.standard_normal((3, 1, 8)).astype(np.float16)
    s = [float(q[0, 0] @ k[t, 0].astype(np.float32)) / math.sqrt(8) for t in range(3)]
    w = np.exp(np.array(s) - max(s))
    w /= w.sum()
    want = sum(w[t] * v[t, 0].astype(np.float64) for t in range(3))
    np.testing.assert_allclose(attention_exact(q, k, v, 2)[0, 0], want, rtol=1e-6)


# -- sliding windows, rings and softcaps (gemma) ----------------------------------------------------

def ring_of(cache: np.ndarray, n_rows: int, n_pos: int, window: int) -> np.ndarray:
    """The ring of n_rows a cache of positions 0..n_pos-1 leaves, as engine.kv stores it:
    position p in row p % n_rows, and in row p % n_rows + n_rows when that is < window - 1."""
    ring = np.full((n_rows + window - 1, *cache.shape[1:]), np.nan, cache.dtype)
    for p in range(n_pos):
        ring[p % n_rows] = cache[p]
        if p % n_rows < window - 1:
            ring[p % n_rows + n_rows] = cache[p]
    return ring


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_q,pos0", [(1, 45), (5, 0), (7, 30), (70, 20)])  # 70: the exact path
def test_a_window_matches_the_twin_and_a_ring_gives_the_bits_of_a_full_cache(kernels, threads,
                                                                            n_q, pos0):
    window, n_pos = 8, pos0 + n_q
    q, k, v = make_case(np.random.default_rng([n_q, pos0]), n_q, pos0, 4, 2, 64, n_pos)
    full = kernels[threads](q, k, v, pos0, window=window)
    np.testing.assert_allclose(full, attention_reference(q, k, v, pos0, window=window),
                               rtol=RTOL, atol=ATOL)
    # only the last `window` keys matter: poisoning older ones changes nothing
    k_old, v_old = k.copy(), v.copy()
    k_old[:max(0, pos0 - window + 1)] = np.nan
    v_old[:max(0, pos0 - window + 1)] = np.nan
    assert np.array_equal(kernels[threads](q, k_old, v_old, pos0, window=window), full)
    n_rows = window + n_q - 1  # the shortest ring that keeps the first query's window
    if n_rows < n_pos:
        k_ring, v_ring = ring_of(k, n_rows, n_pos, window), ring_of(v, n_rows, n_pos, window)
        got = kernels[threads](q, k_ring, v_ring, pos0, window=window, ring=n_rows)
        assert np.array_equal(got.view(np.uint32), full.view(np.uint32))
        for fa in (True, False):  # the twins read the ring's primary rows only
            np.testing.assert_allclose(
                attention_reference(q, k, v, pos0, window=window, flash_attn=fa),
                attention_reference(q, k_ring, v_ring, pos0, window=window, flash_attn=fa,
                                    ring=n_rows), rtol=1e-6, atol=1e-6)


def test_a_window_is_the_textbook_mask():
    """Query at p sees keys p0 with 0 <= p - p0 < window, nothing else (the float64 twin)."""
    q, k, v = make_case(np.random.default_rng(11), 6, 10, 2, 1, 8, 16)
    got = attention_exact(q, k, v, 10, window=3)
    for i in range(6):
        p = 10 + i
        alone = attention_exact(q[i:i + 1], k[p - 2:p + 1], v[p - 2:p + 1], 2)
        np.testing.assert_allclose(got[i], alone[0], rtol=1e-6)


def test_a_ring_too_short_for_the_chunk_is_refused(kernels):
    q, k, v = make_case(np.random.default_rng(12), 4, 20, 2, 1, 64, 24)
    with pytest.raises(ValueError, match="window"):
        kernels[1](q, k[:17].copy(), v[:17].copy(), 20, window=8, ring=10)  # needs 8 + 4 - 1
    with pytest.raises(ValueError, match="window"):
        kernels[1](q, k[:12].copy(), v[:12].copy(), 20, window=8, ring=11)  # no room to mirror


@pytest.mark.parametrize("n_q,pos0", [(3, 9), (66, 0)])
def test_softcap_matches_the_twin_and_bites(kernels, n_q, pos0):
    q, k, v = make_case(np.random.default_rng([n_q, 13]), n_q, pos0, 4, 2, 64, pos0 + n_q)
    q *= 4  # scores of ~+-30: a cap of 5 changes them a lot
    got = kernels[1](q, k, v, pos0, softcap=5.0)
    np.testing.assert_allclose(got, attention_reference(q, k, v, pos0, softcap=5.0),
                               rtol=RTOL, atol=ATOL)
    assert np.abs(got - kernels[1](q, k, v, pos0)).max() > 0.1


@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize(("n_q", "pos0"), [(1, 50), (9, 0), (70, 3)])
def test_sinks_match_the_twin_and_take_their_share(flash_attn, n_q, pos0):
    """gpt-oss's sinks: one more logit per head in the softmax (value 0), on every path."""
    rng = np.random.default_rng(28)
    q, k, v = make_case(rng, n_q, pos0, 4, 2, 32, pos0 + n_q + 8)
    sinks = rng.normal(1.0, 1.5, 4).astype(np.float32)
    sinks[0] = 30.0  # a sink above every score: head 0's output nearly vanishes
    plain_kernel = AttentionKernel(1, flash_attn=flash_attn)
    with_sinks = [AttentionKernel(1, flash_attn=flash_attn, sinks=True),
                  AttentionKernel(2, flash_attn=flash_attn, sinks=True)]
    with_sinks[1].parallel_min_work = 0
    try:
        expected = attention_reference(q, k, v, pos0, flash_attn=flash_attn, sinks=sinks)
        got = [kern(q, k, v, pos0, sinks=sinks) for kern in with_sinks]
        plain = plain_kernel(q, k, v, pos0)
        with pytest.raises(ValueError, match="sinks"):
            plain_kernel(q, k, v, pos0, sinks=sinks)
    finally:
        for kern in (plain_kernel, *with_sinks):
            kern.close()
    np.testing.assert_allclose(got[0], expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(got[0], got[1])
    assert np.abs(got[0][:, 0]).max() < 1e-6 < np.abs(plain[:, 0]).max()
    assert np.abs(got[0][:, 1:] - plain[:, 1:]).mean() > 2e-3  # the other sinks move their heads too
