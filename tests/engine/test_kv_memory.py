"""A quantized KV cache (type_k / type_v) halves the KV memory: the estimate and the allocation
count its rows' ggml block bytes (q8_0: 34 per 32 values against f16's 64)."""
import pytest

from engine import ModelLoadError, estimate_memory
from engine.kv import KVCache, KVLayout
from engine.kv_types import KV_TYPES
from engine.servable import check_servable
from tests.support.refs import SYNTH3_DIR

F16, Q8, Q4 = KV_TYPES["f16"], KV_TYPES["q8_0"], KV_TYPES["q4_0"]


def test_q8_0_kv_takes_17_32nds_of_f16_in_the_estimate_and_the_allocation(smollm2_path):
    path = smollm2_path
    hp = check_servable(path)                 # 30 layers, 3 kv heads of 64
    n_ctx = 256
    f16_row = hp.n_layer * hp.n_head_kv * 2 * 64 * 2          # k + v of a position, f16
    assert hp.kv_bytes_per_token() == f16_row
    assert hp.kv_bytes_per_token(Q8, Q8) == hp.n_layer * hp.n_head_kv * 2 * 2 * 34
    assert hp.kv_bytes_per_token(Q8, F16) == hp.n_layer * hp.n_head_kv * (2 * 34 + 128)
    saved = estimate_memory(path, n_ctx, 2) - estimate_memory(path, n_ctx, 2, type_k=8, type_v="q8_0")
    assert saved == 2 * n_ctx * (f16_row - hp.kv_bytes_per_token(Q8, Q8))
    f16_cache = KVCache(hp, 2, n_ctx)
    q8_cache = KVCache(hp, 2, n_ctx, type_k=Q8, type_v=Q8)
    q4_cache = KVCache(hp, 2, n_ctx, type_k=Q4, type_v=Q4)
    assert f16_cache.nbytes == 2 * KVLayout(hp, n_ctx).bytes_per_slot() == 2 * n_ctx * f16_row
    assert q8_cache.nbytes == 2 * KVLayout(hp, n_ctx).bytes_per_slot(Q8, Q8)
    assert q8_cache.nbytes * 32 == f16_cache.nbytes * 17       # halved, and the scales
    assert q4_cache.nbytes * 32 == f16_cache.nbytes * 9
    k, v, _ = q8_cache.layer(0)
    assert k.shape == (2, n_ctx, hp.n_head_kv, 68) and v.dtype.itemsize == 1


def test_a_head_dim_no_block_fits_is_refused_by_the_estimate():
    path = SYNTH3_DIR / "gemma4_d64_l6_ple_kvshare_f32.gguf"   # head dims 16 and 32
    with pytest.raises(ModelLoadError, match=r"KV cache: .*multiple of 32"):
        estimate_memory(path, 128, 1, type_k="q8_0")
