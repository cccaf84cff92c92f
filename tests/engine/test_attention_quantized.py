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
