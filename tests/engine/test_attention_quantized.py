"""The compiled quantized-KV attention against its numpy twin (attention_quantized_reference)."""
import numpy as np
import pytest

from engine.kernels.attention_quantized import QuantizedAttentionKernel
from engine.kernels.attention_quantized_reference import attention_quantized_reference
from engine.kv_types import KV_TYPES, quantize_rows


@pytest.mark.parametrize("tk, tv", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0")])
@pytest.mark.parametrize("n_q, pos0, window", [(1, 0, 0), (1, 77, 0), (6, 40, 0), (70, 10, 0),
                                               (3, 50, 9)])
def test_kernel_matches_its_twin(tk, tv, n_q, pos0, window):
    rng = np.random.default_rng(n_q + pos0)
    n_head, n_kv, hd = 6, 2, 64
    q = (rng.standard_normal((n_q, n_head, hd)) * 2).astype(np.float32)
    rows = pos0 + n_q
    k = quantize_rows(rng.standard_normal((rows, n_kv, hd)).astype(np.float32), KV_TYPES[tk])
    v = quantize_rows(rng.standard_normal((rows, n_kv, hd)).astype(np.float32), KV_TYPES[tv])
    ours = QuantizedAttentionKernel(KV_TYPES[tk], KV_TYPES[tv])(q, k, v, pos0, window=window)
    twin = attention_quantized_reference(q, k, v, KV_TYPES[tk], KV_TYPES[tv], pos0, window=window)
    np.testing.assert_allclose(ours, twin, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("n_q, pos0, window", [(1, 300, 0), (40, 20, 0), (9, 100, 16)])
def test_a_split_over_threads_gives_the_same_bits(n_q, pos0, window):
    rng = np.random.default_rng(7)
    q8 = KV_TYPES["q8_0"]
    q = rng.standard_normal((n_q, 6, 64)).astype(np.float32)
    k, v = (quantize_rows(rng.standard_normal((pos0 + n_q, 2, 64)).astype(np.float32), q8)
            for _ in range(2))
    one, three = QuantizedAttentionKernel(q8, q8), QuantizedAttentionKernel(q8, q8, n_threads=3)
    try:
        bounds = three.split(n_q, 6, pos0, window)
        assert bounds[0] == 0 and bounds[-1] == n_q * 6 and len(bounds) == 4
        assert bounds == sorted(bounds)
        np.testing.assert_array_equal(three(q, k, v, pos0, window=window),
                                      one(q, k, v, pos0, window=window))
    finally:
        three.close()


@pytest.mark.parametrize("hd, n_head, n_kv", [(32, 8, 2), (96, 4, 1), (128, 4, 4), (256, 2, 1),
                                              (64, 10, 1)])
def test_every_head_dim_and_group_matches_the_twin(hd, n_head, n_kv):
    """One function per head_dim (a key group of 1 to 4 keys, a padded lane sum at 96), and
    groups of 1 to 10 heads (runs of at most GROUP_MAX)."""
    rng = np.random.default_rng(hd + n_head)
    q8, q4 = KV_TYPES["q8_0"], KV_TYPES["q4_0"]
    n_q, pos0 = 3, 45                                   # 46..48 keys: whole groups and a tail
    q = (rng.standard_normal((n_q, n_head, hd)) * 2).astype(np.float32)
    k = quantize_rows(rng.standard_normal((pos0 + n_q, n_kv, hd)).astype(np.float32), q8)
    v = quantize_rows(rng.standard_normal((pos0 + n_q, n_kv, hd)).astype(np.float32), q4)
    ours = QuantizedAttentionKernel(q8, q4)(q, k, v, pos0)
    np.testing.assert_allclose(ours, attention_quantized_reference(q, k, v, q8, q4, pos0),
                               atol=2e-5, rtol=1e-5)
