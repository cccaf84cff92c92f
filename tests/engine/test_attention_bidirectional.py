"""Bidirectional rows in the attention kernels (Gemma 3's images: an embedding span's rows see
each other) against the numpy twins, and the twins against a mask written out key by key."""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from engine.kernels.attention import AttentionKernel
from engine.kernels.attention_reference import attention_exact, attention_reference

RTOL, ATOL = 2e-3, 1e-3  # as tests/test_attention.py: the f16 accumulator's ulps


@pytest.fixture(scope="module")
def kernels() -> Iterator[dict[tuple[bool, int], AttentionKernel]]:
    out = {(fa, n): AttentionKernel(n, flash_attn=fa, bidirectional=True)
           for fa in (True, False) for n in (1, 2)}
    for (_, n), kern in out.items():
        if n == 2:
            kern.parallel_min_work = 0  # the pool's task path, even for small cases
    yield out
    for kern in out.values():
        kern.close()


def _case(n_q: int, pos0: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, 4, 64)).astype(np.float32)          # [n_q, n_head, head_dim]
    k = rng.standard_normal((pos0 + n_q + 3, 2, 64)).astype(np.float16)  # [n_ctx, n_kv, hd]
    v = rng.standard_normal(k.shape).astype(np.float16)
    k[pos0 + n_q:] = np.nan  # past the chunk: poison, no row may read it
    v[pos0 + n_q:] = np.nan
    return q, k, v


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize("n_q,pos0,bi,window", [
    (20, 7, (3, 15), 0),     # f16acc
    (20, 7, (0, 20), 6),     # the whole chunk, a window shorter than the span
    (70, 5, (10, 60), 0),    # exact (>= TILED_MIN_QUERIES)
    (70, 5, (30, 70), 24),
])
def test_kernels_match_the_twin(kernels, threads, flash_attn, n_q, pos0, bi, window):
    q, k, v = _case(n_q, pos0, n_q + pos0 + window)
    got = kernels[flash_attn, threads](q, k, v, pos0, window=window, bidirectional=bi)
    want = attention_reference(q, k, v, pos0, window=window, flash_attn=flash_attn,
                               bidirectional=bi)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    causal = kernels[flash_attn, threads](q, k, v, pos0, window=window)
    a, b = bi
    outside = np.r_[0:a, b:n_q]
    assert np.array_equal(got[outside], causal[outside])  # rows outside the span: causal bits
    assert np.abs(got[a:b - 1] - causal[a:b - 1]).min(axis=(1, 2)).max() > 0  # inside: it bites


def test_an_empty_range_gives_the_bits_of_the_causal_kernel(kernels):
    q, k, v = _case(20, 7, 1)
    plain = AttentionKernel(1)
    assert np.array_equal(kernels[True, 1](q, k, v, 7, bidirectional=(4, 4)), plain(q, k, v, 7))


def test_the_twin_is_softmax_over_the_mask_llama_cpp_builds():
    """llama.cpp without causal attention for an image batch: query i (position pos0 + i) sees
    key p when p <= pos0 + i, or when i is in the span and p is before the span's end; the
    window drops keys with pos0 + i - p >= window."""
    n_q, pos0, (a, b), window = 12, 5, (2, 9), 4
    q, k, v = _case(n_q, pos0, 3)
    want = np.zeros(q.shape)
    for i in range(n_q):
        for h in range(4):
            kv = h // 2
            s, vals = [], []
            for p in range(pos0 + n_q):
                seen = p <= pos0 + i or (a <= i < b and p < pos0 + b)
                if seen and not (window and pos0 + i - p >= window):
                    s.append(float(q[i, h].astype(np.float64) @ k[p, kv].astype(np.float64)) / 8.0)
                    vals.append(v[p, kv].astype(np.float64))
            e = [math.exp(x - max(s)) for x in s]
            want[i, h] = sum(w * r for w, r in zip(e, vals)) / sum(e)
    got = attention_exact(q, k, v, pos0, window=window, bidirectional=(a, b))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_range_needs_a_kernel_built_for_it_and_must_fit_the_chunk(kernels):
    q, k, v = _case(10, 0, 2)
    with pytest.raises(ValueError, match="bidirectional=True"):
        AttentionKernel(1)(q, k, v, 0, bidirectional=(0, 5))
    with pytest.raises(ValueError, match="range"):
        kernels[True, 1](q, k, v, 0, bidirectional=(3, 11))


def _ring_case(n_q: int, pos0: int, ring: int, mirror: int,
               seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ring cache as engine.kv stores it: the key at position p in row p % ring, the first
    `mirror` rows again past the end; positions before the ring's last `ring` are gone."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, 4, 64)).astype(np.float32)           # [n_q, n_head, head_dim]
    k = np.full((ring + mirror, 2, 64), np.nan, np.float16)            # [rows, n_kv, hd]
    v = k.copy()
    for p in range(max(0, pos0 + n_q - ring), pos0 + n_q):
        k[p % ring], v[p % ring] = rng.standard_normal((2, 2, 64))
    k[ring:], v[ring:] = k[:mirror], v[:mirror]
    return q, k, v


@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize("n_q,pos0,bi,window,ring", [
    (20, 30, (4, 20), 8, 27),    # the span wraps the ring; f16acc
    (40, 50, (0, 40), 8, 47),    # a whole chunk of span, as long as the ring allows; exact
    (40, 21, (10, 38), 8, 47),   # the window wraps, the span not
])
def test_a_range_reads_across_a_rings_wrap_through_its_mirror(kernels, flash_attn, n_q, pos0, bi,
                                                              window, ring):
    q, k, v = _ring_case(n_q, pos0, ring, ring - 1, n_q + pos0)
    got = kernels[flash_attn, 2](q, k, v, pos0, window=window, ring=ring, bidirectional=bi)
    # the twin reads the ring's primary rows only, never its mirror
    want = attention_reference(q, k[:ring], v[:ring], pos0, window=window, flash_attn=flash_attn,
                               ring=ring, bidirectional=bi)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_a_range_is_refused_where_the_ring_mirrors_a_window_only(kernels):
    q, k, v = _ring_case(20, 30, 27, 7, 1)   # a causal ring's mirror: window - 1
    kernels[True, 1](q, k, v, 30, window=8, ring=27)
    with pytest.raises(ValueError, match="mirrors"):
        kernels[True, 1](q, k, v, 30, window=8, ring=27, bidirectional=(4, 20))
