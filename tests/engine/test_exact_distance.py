"""Issue #36's accuracy rule: our logits are as close to an exact evaluation as llama.cpp's.

The row-interleaved kernels (engine.kernels.gemm) sum blocks in another order than llama.cpp;
they are acceptable when, on the real models' reference prompts, the distance of our logits to
the float64 evaluation of the same dequantized weights (tests/support/exact_distance.py) is no
larger than llama.cpp's stored logits' distance, with a margin: MARGIN.

The margin is the distance's own run-to-run spread, not a licence: a rounding change of no
systematic effect (llama.cpp's q8_1 scales kept in f32 instead of rounded to f16, which is
closer to exact by construction) moved SmolLM2's pooled distance by 5% (0.166 -> 0.170), and
the file layout sits at 1.08x llama.cpp's. A wrong scale, offset or lane moves it by
multiples (s = sum(x) in place of q8_1's d * sum(q) gave 2.6x).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import engine
from engine.formats.repack import RepackedMatrix
from engine.kernels.gemm.facade import host_isa, runs_in_models
from tests.support.exact_distance import measure, pooled
from tests.support.reference_model import ReferenceModel
from tests.support.refs import GEMMA3_DIR, REFS_DIR

pytestmark = pytest.mark.real_model

MARGIN = 1.2  # ours <= MARGIN x llama.cpp's distance, pooled over a model's prompts


def _check(path: Path, refs: Path) -> None:
    model = engine.load(path, n_ctx=2048, n_threads=2)
    try:
        # the rule is for the interleaved kernels: on a host that runs them, they are in use
        layer = model.transformer.weights.layers[0]
        mats = [m for m in vars(layer).values() if hasattr(m, "qtype")]
        for m in mats:
            assert isinstance(m, RepackedMatrix) == runs_in_models(m.qtype, host_isa())
        rows = measure(ReferenceModel(str(path)), refs, model.logits)
    finally:
        model.close()
    ours, llama = pooled(rows)
    for r in rows:
        print(f"{r.name}: ours {r.ours}, llama.cpp {r.llama}")
    print(f"pooled: ours {ours}, llama.cpp {llama}")
    assert ours.top32 <= MARGIN * llama.top32
    assert ours.last <= MARGIN * llama.last


def test_smollm2_q4_1_is_as_close_to_exact_as_llama_cpp(smollm2_path: Path) -> None:
    _check(smollm2_path, REFS_DIR)


def test_gemma3_is_as_close_to_exact_as_llama_cpp(gemma3_path: Path) -> None:
    _check(gemma3_path, GEMMA3_DIR)
