"""Bidirectional embedding spans through the model (Gemma 3's images): the fused graph and the
eager twin agree, the span changes only the rows that see it, a chunk never cuts it, prefix
reuse never stops inside it, and across a sliding-window ring's wrap it gives what a cache
without a ring gives."""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine.kv
from engine.api import Model
from engine.batch import BatchRunner, Sequence, State
from engine.model import Chunk
from engine.prompt import EmbeddingSpan, Prompt, TokenSpan
from engine.sampling import SamplingParams
from tests.support.refs import VLM_DIR

BASE = next(b for b in json.loads((VLM_DIR / "manifest.json").read_text())["bases"]
            if b["base"] == "gemma3_vlm")


@pytest.fixture(scope="module")
def model() -> Model:
    m = Model(VLM_DIR / BASE["text_file"], n_ctx=64, flash_attn=False, images=True)
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


def test_a_text_only_load_keeps_causal_kernels_and_refuses_the_span() -> None:
    """Without images=True a gemma3 load is what it was before images: its rings mirror a
    window, not a ring, and a bidirectional span is refused rather than read causally."""
    with Model(VLM_DIR / BASE["text_file"], n_ctx=64, flash_attn=False) as text_only:
        assert not text_only.transformer.bidirectional
        with pytest.raises(ValueError, match="images=True"):
            text_only.transformer.forward([Chunk(0, _prompt(text_only, True, "bi"), 0)])
        causal = _prompt(text_only, False, "causal")
        assert text_only.transformer.forward([Chunk(0, causal, 0)], "all")[0].shape[0] == len(causal)


def test_a_chunk_never_cuts_a_bidirectional_span(model: Model) -> None:
    p = _prompt(model, True, "bi")
    assert p.chunk_end(0, 5) == 3 and p.chunk_end(3, 5) == 12 and p.chunk_end(0, 14) == 14
    with pytest.raises(ValueError, match="all of its rows"):
        model.transformer.forward([Chunk(0, p[0:5], 0)])


def _ends_with_a_span(model: Model) -> Prompt:
    rows = np.random.default_rng(1).standard_normal((9, model.transformer.hp.n_embd)).astype(np.float32)
    return Prompt([TokenSpan((2, 10, 11)), EmbeddingSpan(rows, "last", bidirectional=True)])


def test_prefix_reuse_stops_before_a_bidirectional_span_not_inside(model: Model) -> None:
    # the prompt's last position is never reused (its logits are wanted), which would cut
    # the span at its end: the reuse goes back to the span's start and reads it whole again
    p = _ends_with_a_span(model)
    assert p.resume_point(11) == 3 and p.resume_point(12) == 12 and p.resume_point(2) == 2
    want = list(model.generate(p, max_tokens=3, stop_at_eog=False))
    assert list(model.generate(p, max_tokens=3, stop_at_eog=False)) == want  # engine.api
    runner = BatchRunner(model)
    try:
        seqs = []
        for _ in range(2):  # the second is admitted into the slot the first left
            seqs.append(Sequence(p, params=SamplingParams(temperature=0.0), max_tokens=3,
                                 stop_at_eog=False))
            runner.submit(seqs[-1])
            while seqs[-1].state is not State.FINISHED:
                runner.step()
        assert seqs[1].cached == 3 and seqs[0].generated == seqs[1].generated == want
    finally:
        runner.close()


def _ring_prompt(n_embd: int) -> Prompt:
    """Tokens, a span across position 39 (a ring of 39 rows wraps there), tokens, a span
    across 78 (its second wrap), tokens: 100 positions."""
    rng = np.random.default_rng(2)
    ids = [int(i) for i in rng.integers(3, 380, 100)]
    rows = rng.standard_normal((2, 9, n_embd)).astype(np.float32)
    return Prompt([TokenSpan(tuple(ids[:35])), EmbeddingSpan(rows[0], "one", bidirectional=True),
                   TokenSpan(tuple(ids[44:74])), EmbeddingSpan(rows[1], "two", bidirectional=True),
                   TokenSpan(tuple(ids[83:]))])


def _chunked_logits(model: Model, p: Prompt, size: int, eager: bool) -> np.ndarray:
    tr, out, a = model.transformer, [], 0
    while a < len(p):
        b = p.chunk_end(a, min(a + size, len(p)))
        fwd = tr.forward_eager if eager else tr.forward
        out.append(fwd([Chunk(0, p[a:b], a)], "all")[0])
        a = b
    return np.concatenate(out)


def test_a_span_across_a_rings_wrap_gives_what_a_full_cache_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a chunk of at most 24 makes the 16-key window's ring 16 + 23 = 39 rows at n_ctx 128;
    # without the patch the ring is the whole context, read without a wrap
    full = Model(VLM_DIR / BASE["text_file"], n_ctx=128, flash_attn=False, images=True)
    monkeypatch.setattr(engine.kv, "MAX_CHUNK", 24)
    ringed = Model(VLM_DIR / BASE["text_file"], n_ctx=128, flash_attn=False, images=True)
    try:
        groups = ringed.transformer.cache.layout.groups
        assert [(g.is_ring, g.ring, g.mirror) for g in groups] == [(True, 39, 38)], groups
        assert not full.transformer.cache.layout.groups[0].is_ring
        p = _ring_prompt(full.transformer.hp.n_embd)
        want = _chunked_logits(full, p, 24, eager=False)
        fused = _chunked_logits(ringed, p, 24, eager=False)
        eager = _chunked_logits(ringed, p, 24, eager=True)
        assert np.array_equal(fused, eager)
        np.testing.assert_allclose(fused, want, rtol=0, atol=1e-5)
    finally:
        ringed.close()
        full.close()
