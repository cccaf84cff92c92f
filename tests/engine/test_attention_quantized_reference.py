"""The quantized-KV attention twin (engine.kernels.attention_quantized_reference) against
independent formulations: float64 exact attention over the dequantized rows with the query
rounded through q8_0 (what llama.cpp's integer block dots compute, up to float32 sums), and, with
an f16 cache, the f16-accumulator twin the f16 kernels are tested with."""
import numpy as np
import pytest

from engine.kernels.attention_quantized_reference import attention_quantized_reference
from engine.kernels.attention_reference import attention_exact, attention_f16acc_reference
from engine.kv_types import KV_TYPES, dequantize_rows, quantize_rows

Q8 = KV_TYPES["q8_0"]


def _case(seed, n_q=5, pos0=40, n_head=4, n_kv=2, hd=64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((pos0 + n_q + 3, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((pos0 + n_q + 3, n_kv, hd)).astype(np.float32)
    return q, k, v, pos0


@pytest.mark.parametrize("tk, tv", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")])
@pytest.mark.parametrize("window, softcap", [(0, 0.0), (7, 0.0), (0, 5.0)])
def test_quantized_twin_is_exact_attention_over_its_rows(tk, tv, window, softcap):
    q, k, v, pos0 = _case(1)
    tk_, tv_ = KV_TYPES[tk], KV_TYPES[tv]
    k_rows, v_rows = quantize_rows(k, tk_), quantize_rows(v, tv_)
    ours = attention_quantized_reference(q, k_rows, v_rows, tk_, tv_, pos0, window=window,
                                         softcap=softcap)
    q_read = dequantize_rows(quantize_rows(q, Q8), Q8, 64)
    exact = attention_exact(q_read, dequantize_rows(k_rows, tk_, 64), dequantize_rows(v_rows, tv_, 64),
                            pos0, window=window, softcap=softcap)
    tol = 2e-3 if tv == "f16" else 2e-5                 # an f16 accumulator rounds each step
    np.testing.assert_allclose(ours, exact, atol=tol, rtol=0)
    plain = attention_exact(q, k, v, pos0, window=window, softcap=softcap)
    assert np.abs(ours - plain).max() > 5e-3             # the cache's rounding shows


def test_f16_cache_is_the_f16_accumulator_twin():
    q, k, v, pos0 = _case(2)
    f16 = KV_TYPES["f16"]
    ours = attention_quantized_reference(q, k.astype(np.float16), v.astype(np.float16), f16, f16, pos0)
    np.testing.assert_allclose(ours, attention_f16acc_reference(q, k.astype(np.float16),
                                                                v.astype(np.float16), pos0),
                               atol=1e-6, rtol=0)
