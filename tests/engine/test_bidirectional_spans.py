"""Bidirectional embedding spans through the model (Gemma 3's images): the fused graph and the
eager twin agree, the span changes only the rows that see it, and a chunk never cuts it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.api import Model
from engine.model import Chunk
from engine.prompt import EmbeddingSpan, Prompt, TokenSpan
from tests.support.refs import VLM_DIR

BASE = next(b for b in json.loads((VLM_DIR / "manifest.json").read_text())["bases"]
            if b["base"] == "gemma3_vlm")


@pytest.fixture(scope="module")
def model() -> Model:
    m = Model(VLM_DIR / BASE["text_file"], n_ctx=64, flash_attn=False)
    yield m
    m.close()


def _prompt(model: Model, bidirectional: bool, key: str) -> Prompt:
    rows = np.random.default_rng(0).standard_normal((9, model.transformer.hp.n_embd)).astype(np.float32)
    return Prompt([TokenSpan((2, 10, 11)), EmbeddingSpan(rows, key, bidirectional=bidirectional),
                   TokenSpan((12, 13, 14))])


def test_fused_equals_eager_and_the_span_bites(model: Model) -> None:
    tr = model.transformer
    p = _prompt(model, True, "bi")
    fused = tr.forward([Chunk(0, p, 0)], "all")[0]
    eager = tr.forward_eager([Chunk(0, p, 0)], "all")[0]
    assert np.array_equal(fused, eager)
    causal = tr.forward([Chunk(0, _prompt(model, False, "causal"), 0)], "all")[0]
    assert np.array_equal(fused[:3], causal[:3])         # before the span: nothing changes
    assert np.abs(fused[3:11] - causal[3:11]).max() > 1e-3  # its rows see the later ones


def test_a_chunk_never_cuts_a_bidirectional_span(model: Model) -> None:
    p = _prompt(model, True, "bi")
    assert p.chunk_end(0, 5) == 3 and p.chunk_end(3, 5) == 12 and p.chunk_end(0, 14) == 14
    with pytest.raises(ValueError, match="all of its rows"):
        model.transformer.forward([Chunk(0, p[0:5], 0)])
