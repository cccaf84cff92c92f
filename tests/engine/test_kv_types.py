"""KV cache types (engine.kv_types): names and ggml numbers, and the row quantizers against
gguf-py's ggml-exact ones (an independent implementation of ggml-quants.c)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize as gguf_quantize

from engine.kv_types import KV_TYPES, dequantize_rows, kv_type, quantize_rows


@pytest.mark.parametrize("value, name", [("f16", "f16"), ("Q8_0", "q8_0"), (" q4_0", "q4_0"),
                                         (1, "f16"), (8, "q8_0"), (2, "q4_0")])
def test_names_and_ggml_numbers(value, name):
    assert kv_type(value).name == name


@pytest.mark.parametrize("value", ["q5_1", "f32", 0, 3, True, "", 8.0])
def test_unsupported_types_are_refused_naming_the_choices(value):
    with pytest.raises(ValueError, match=r"q8_0 \(8\)"):
        kv_type(value)


@pytest.mark.parametrize("name, gtype", [("q8_0", GT.Q8_0), ("q4_0", GT.Q4_0)])
def test_quantized_rows_are_ggml_blocks(name, gtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 3, 64)) * rng.uniform(0.01, 30, (5, 3, 1))).astype(np.float32)
    x[0, 0, :32] = 0  # an all-zero block
    ours = quantize_rows(x, KV_TYPES[name])
    theirs = gguf_quantize(x.reshape(15, 64), gtype).reshape(ours.shape)
    np.testing.assert_array_equal(ours, theirs)
    back = dequantize_rows(ours, KV_TYPES[name], 64)
    step = np.abs(x).max(axis=-1, keepdims=True) / (127 if name == "q8_0" else 7)
    assert np.all(np.abs(back - x) <= step)


def test_row_bytes_halve_and_quarter_f16():
    assert [KV_TYPES[n].row_bytes(64) for n in ("f16", "q8_0", "q4_0")] == [128, 68, 36]
    with pytest.raises(ValueError, match="multiple of 32"):
        KV_TYPES["q8_0"].row_bytes(48)
