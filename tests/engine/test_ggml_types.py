"""engine.formats.ggml_types against gguf-py's tables (the engine avoids importing gguf-py at load)."""
from __future__ import annotations

import subprocess
import sys

import gguf

from engine.formats import ggml_types


def test_tensor_types_and_block_sizes_match_gguf_py() -> None:
    ours = {t.name: t.value for t in ggml_types.GGMLQuantizationType}
    theirs = {t.name: t.value for t in gguf.GGMLQuantizationType}
    assert ours == theirs
    for t in gguf.GGMLQuantizationType:
        if t in gguf.GGML_QUANT_SIZES:
            assert ggml_types.GGML_QUANT_SIZES[t] == gguf.GGML_QUANT_SIZES[t], t.name


def test_value_types_match_gguf_py() -> None:
    assert {t.name: t.value for t in ggml_types.GGUFValueType} == \
        {t.name: t.value for t in gguf.GGUFValueType}


def test_members_are_interchangeable_with_gguf_py_ones() -> None:
    table = {ggml_types.GGMLQuantizationType.Q4_1: "ours"}
    assert table[gguf.GGMLQuantizationType.Q4_1] == "ours"
    assert gguf.GGMLQuantizationType.Q6_K in frozenset(ggml_types.GGMLQuantizationType)


def test_loading_the_engine_does_not_import_gguf_py() -> None:
    code = "import sys, engine; print('gguf' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
