"""What a quantized KV cache does to the logits, pinned against llama.cpp (tests/data/kvq): the
float64 model (tests/support/reference_model.py) storing its keys and values as q8_0 / q4_0 blocks
(gguf-py's ggml-exact quantizers) and its queries as q8_0 for the key dot, as llama.cpp's flash
attention does, matches llama.cpp's logits with that cache far inside llama.cpp's own spread
between that cache and f16. This is the behaviour the engine's quantized-KV kernels follow."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize, quantize

from tests.support.reference_model import ReferenceModel
from tests.support.refs import DATA_DIR, SYNTH_DIR

KVQ_DIR = DATA_DIR / "kvq"
GGML = {"q8_0": GT.Q8_0, "q4_0": GT.Q4_0}


def round_trip(gtype):
    """float64 [..., head_dim] -> stored as ggml blocks of gtype and read back."""
    def store(x: np.ndarray) -> np.ndarray:
        flat = x.reshape(-1, x.shape[-1]).astype(np.float32)
        return dequantize(quantize(flat, gtype), gtype).reshape(x.shape).astype(np.float64)
    return store


@pytest.fixture(scope="module")
def synth():
    ref = np.load(KVQ_DIR / "synth_qwen3.npz")
    model = ReferenceModel(str(SYNTH_DIR / "qwen3_d64_hd32_qknorm_f32.gguf"))
    return ref, model


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_quantized_kv_twin_matches_llama_cpp_far_inside_its_spread(synth, kv):
    ref, model = synth
    ids, top = ref["random_ids"].tolist(), ref["random_top_ids"]
    ours = np.take_along_axis(model.logits(ids, round_trip(GGML[kv]), round_trip(GT.Q8_0)), top, axis=1)
    spread = np.abs(ref[f"random_{kv}"] - ref["random_f16"]).max()        # llama.cpp's own
    assert spread > 0.1                                                   # the cache type matters
    assert np.abs(ours - ref[f"random_{kv}"]).max() < spread / 10
    exact = np.take_along_axis(model.logits(ids), top, axis=1)            # no cache rounding
    assert np.abs(exact - ref["random_f16"]).max() < spread / 10
    assert np.abs(exact - ref[f"random_{kv}"]).max() > spread / 2        # the twin is not f16's
