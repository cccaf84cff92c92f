"""attention_blocked (prefill chunks in tiles over long caches) against its numpy twin, the
float64 softmax, and itself: bits independent of tiles, threads, register plan and F16C."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.kernels.attention import AttentionKernel
from engine.kernels.attention_ir import (
    TILE_KEYS,
    TILED_MIN_QUERIES,
    blocked_scratch_floats,
    exact_scratch_floats,
)
from engine.kernels.attention_reference import attention_blocked_reference, attention_exact

# f32 against the twin's f32 (dot products summed in another order) and against float64
TWIN_TOL = dict(rtol=1e-5, atol=2e-6)
EXACT_TOL = dict(rtol=1e-4, atol=1e-5)


def make_case(seed: int | list[int], n_q: int, pos0: int, n_head: int, n_kv_head: int,
              head_dim: int, n_ctx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, n_head, head_dim)).astype(np.float32)       # [n_q, n_head, head_dim]
    k = rng.standard_normal((n_ctx, n_kv_head, head_dim)).astype(np.float16)  # [n_ctx, n_kv_head, head_dim]
    v = rng.standard_normal((n_ctx, n_kv_head, head_dim)).astype(np.float16)
    k[pos0 + n_q:] = np.nan  # rows past the sequence are poison: a read of them shows as NaN
    v[pos0 + n_q:] = np.nan
    return q, k, v


def run_blocked(kern: AttentionKernel, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int,
                out: np.ndarray, w_begin: int, w_end: int, window: int = 0) -> None:
    """attention_blocked itself over items [w_begin, w_end), as one thread of a split runs it."""
    n_q, n_head, head_dim = q.shape
    scratch = np.full(max(blocked_scratch_floats(head_dim),
                          exact_scratch_floats(pos0 + n_q, n_head, k.shape[1])), np.nan, np.float32)
    kern._blocked(q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data, scratch.ctypes.data,
                  n_q, n_head, k.shape[1], head_dim, pos0, 1 / math.sqrt(head_dim), w_begin, w_end,
                  window, k.shape[0], 0.0)


@pytest.fixture(scope="module")
def kern() -> AttentionKernel:
    return AttentionKernel(1)


# (n_q, pos0, n_head, n_kv_head, head_dim): SmolLM2's and Gemma 3 270M's shapes, MHA, a chunk
# that is not a multiple of a tile, positions across block edges
CASES = [(TILED_MIN_QUERIES, 0, 9, 3, 64), (70, 37, 9, 3, 64), (65, 300, 4, 1, 256),
         (100, 1000, 4, 4, 128), (64, 15, 6, 2, 80), (77, 16, 16, 1, 64)]


@pytest.mark.parametrize("n_q,pos0,n_head,n_kv_head,head_dim", CASES)
def test_matches_its_twin_and_the_float64_softmax(kern, n_q, pos0, n_head, n_kv_head, head_dim):
    q, k, v = make_case([n_q, pos0], n_q, pos0, n_head, n_kv_head, head_dim, pos0 + n_q + 3)
    got = kern(q, k, v, pos0)
    np.testing.assert_allclose(got, attention_blocked_reference(q, k, v, pos0), **TWIN_TOL)
    np.testing.assert_allclose(got, attention_exact(q, k, v, pos0), **EXACT_TOL)


def test_twin_is_the_float64_softmax():
    q, k, v = make_case(7, 70, 45, 4, 2, 32, 120)
    np.testing.assert_allclose(attention_blocked_reference(q, k, v, 45),
                               attention_exact(q, k, v, 45), **EXACT_TOL)


@pytest.mark.parametrize("window,ring", [(24, None), (24, 100), (200, None)])
def test_windows_and_rings_match_the_twin(kern, window, ring):
    """A sliding window (Gemma 3) masks per row; a ring (its first rows mirrored past the end,
    as engine.kv stores it) reads the same keys as the full cache would."""
    n_q, pos0 = 70, 150
    q, k, v = make_case([window, 3], n_q, pos0, 4, 1, 64, pos0 + n_q)
    full = kern(q, k, v, pos0, window=window)
    np.testing.assert_allclose(full, attention_blocked_reference(q, k, v, pos0, window=window), **TWIN_TOL)
    np.testing.assert_allclose(full, attention_exact(q, k, v, pos0, window=window), **EXACT_TOL)
    if ring is not None:
        positions = np.arange(pos0 + n_q)
        k_ring = np.full((ring + window - 1,) + k.shape[1:], np.nan, np.float16)
        v_ring = k_ring.copy()
        keep = positions[positions >= pos0 - window + 1]   # what a ring still holds
        k_ring[keep % ring], v_ring[keep % ring] = k[keep], v[keep]
        k_ring[ring:] = k_ring[:window - 1]                 # the mirror
        v_ring[ring:] = v_ring[:window - 1]
        got = kern(q, k_ring, v_ring, pos0, window=window, ring=ring)
        assert np.array_equal(got.view(np.uint32), full.view(np.uint32))


def test_softcap_sinks_and_a_bidirectional_span_match_the_twin():
    """Gemma 2's softcap, gpt-oss's sinks and Gemma 3's image spans, in the blocked function."""
    n_q, pos0, n_head = 80, 40, 8
    q, k, v = make_case(11, n_q, pos0, n_head, 2, 64, pos0 + n_q)
    q *= 4  # scores large enough for the cap to bite
    capped = AttentionKernel(1)(q, k, v, pos0, softcap=5.0)
    # (scores 4x larger: exp's and tanh's ~2e-7 relative errors grow with them)
    np.testing.assert_allclose(capped, attention_blocked_reference(q, k, v, pos0, softcap=5.0), **EXACT_TOL)
    np.testing.assert_allclose(capped, attention_exact(q, k, v, pos0, softcap=5.0), **EXACT_TOL)
    sinks = np.random.default_rng(2).standard_normal(n_head).astype(np.float32) * 3
    sunk = AttentionKernel(1, sinks=True)(q, k, v, pos0, sinks=sinks)
    np.testing.assert_allclose(sunk, attention_blocked_reference(q, k, v, pos0, sinks=sinks), **EXACT_TOL)
    np.testing.assert_allclose(sunk, attention_exact(q, k, v, pos0, sinks=sinks), **EXACT_TOL)
    span = (10, 30)
    bi = AttentionKernel(1, bidirectional=True)(q, k, v, pos0, bidirectional=span)
    np.testing.assert_allclose(bi, attention_blocked_reference(q, k, v, pos0, bidirectional=span),
                               **EXACT_TOL)
    np.testing.assert_allclose(bi, attention_exact(q, k, v, pos0, bidirectional=span), **EXACT_TOL)


@pytest.mark.parametrize("n_head,n_kv_head", [(9, 3), (4, 1), (8, 8)])
def test_any_cut_of_the_items_gives_the_same_bits(kern, n_head, n_kv_head):
    """Rows take tiles with whichever rows the range holds; their bits never change."""
    n_q, pos0, head_dim = 66, 2 * TILE_KEYS + 5, 64
    q, k, v = make_case([n_head, 5], n_q, pos0, n_head, n_kv_head, head_dim, pos0 + n_q)
    n_items = n_q * n_head
    whole = np.full_like(q, np.nan)
    run_blocked(kern, q, k, v, pos0, whole, 0, n_items)
    rng = np.random.default_rng(n_head)
    for _ in range(4):
        cuts = np.sort(rng.choice(np.arange(1, n_items), size=4, replace=False))
        out = np.full_like(q, np.nan)
        for lo, hi in zip([0, *cuts], [*cuts, n_items]):
            run_blocked(kern, q, k, v, pos0, out, int(lo), int(hi))
            assert np.isnan(out.reshape(n_items, head_dim)[hi:]).all()  # nothing past its range
        assert np.array_equal(out.view(np.uint32), whole.view(np.uint32)), cuts


def test_two_threads_give_one_threads_bits():
    q, k, v = make_case(3, 200, 500, 9, 3, 64, 700)
    one, two = AttentionKernel(1), AttentionKernel(2)
    two.parallel_min_work = 0
    try:
        assert np.array_equal(one(q, k, v, 500).view(np.uint32), two(q, k, v, 500).view(np.uint32))
    finally:
        two.close()


@pytest.mark.parametrize("f16c", [True, False])
def test_avx2_register_plan_and_portable_f16_give_the_same_bits(f16c):
    """The plan for 16 registers (AVX2: one row vector per tile, 16 rows) and for 32 (AVX-512:
    32 rows), with or without F16C, compute each row identically."""
    q, k, v = make_case(4, 90, 77, 8, 2, 128, 170)
    got = [AttentionKernel(1, f16c=f16c, registers=r)(q, k, v, 77) for r in (16, 32)]
    base = AttentionKernel(1)(q, k, v, 77)
    assert np.array_equal(got[0].view(np.uint32), got[1].view(np.uint32))
    assert np.array_equal(got[0].view(np.uint32), base.view(np.uint32))


def test_head_dim_not_a_multiple_of_16_runs_exact_whole(kern):
    q, k, v = make_case(5, 70, 10, 4, 2, 72, 80)
    out = np.full_like(q, np.nan)
    run_blocked(kern, q, k, v, 10, out, 0, 70 * 4)
    exact = np.full_like(q, np.nan)
    scratch = np.empty(exact_scratch_floats(80, 4, 2), np.float32)
    kern._exact(q.ctypes.data, k.ctypes.data, v.ctypes.data, exact.ctypes.data, scratch.ctypes.data,
                70, 4, 2, 72, 10, 1 / math.sqrt(72), 0, 280, 0, 80, 0.0)
    assert np.array_equal(out.view(np.uint32), exact.view(np.uint32))
