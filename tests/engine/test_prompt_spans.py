"""Prompts made of spans (engine.prompt) and chunks that ask for their last k rows' logits.

The oracle for an embedding span is the tokens it stands for: the rows of known tokens'
embeddings (the token_embd rows, dequantized, before the family's scale) fed as a span must
give the same logits as the tokens, bit for bit, fused and eager, on a llama, a gemma (whose
graph scales both by sqrt(n_embd)) and the real SmolLM2. The last k rows' logits are held to
the matching rows of output="all".
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import engine
from engine.batch import BatchRunner, Sequence, State
from engine.formats import quants
from engine.model import Chunk
from engine.prompt import EmbeddingSpan, Prompt, TokenSpan, common_prefix
from engine.sampling import SamplingParams
from tests.support.ggufgen import write_tiny_llama
from tests.support.refs import SYNTH_DIR

PROMPT = "hello world, the quick brown fox jumps over the lazy dog"
GREEDY = SamplingParams(temperature=0.0)


def token_rows(model: engine.Model, ids: list[int]) -> np.ndarray:
    """float32 [n, n_embd]: the file's token_embd rows of ids, dequantized (no embedding scale)."""
    te = model.transformer.weights.token_embd
    return quants.dequantize(te.raw[np.asarray(ids, np.int64)], te.qtype, te.n_cols)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_llama(tmp_path_factory.mktemp("spans") / "tiny.gguf", n_layer=2, qtype=Q.Q8_0)
    with engine.load(path, n_ctx=128, n_threads=2, n_slots=4) as model:
        yield model


def fresh(model: engine.Model) -> None:
    for s in range(model.n_slots):
        model.transformer.cache.tokens[s] = []


# -- the type ------------------------------------------------------------------------------------

def test_a_prompt_counts_positions_and_keys_them_by_token_or_span_row() -> None:
    img = EmbeddingSpan(np.ones((3, 4), np.float32), "img")
    p = Prompt([TokenSpan((5, 6)), img, TokenSpan((7,))])
    assert len(p) == 6 and p.has_embeddings
    assert p.position_keys() == [5, 6, ("img", 0), ("img", 1), ("img", 2), 7]
    assert p.token_ids() == [5, 6, 7]  # what repetition penalties count
    assert p.embedding_spans() == [(2, img)]
    assert p[3:6].position_keys() == [("img", 1), ("img", 2), 7]
    uncounted = Prompt(p.spans)[3:6]  # a slice of a prompt whose keys were never asked for
    assert uncounted.position_keys() == [("img", 1), ("img", 2), 7]
    np.testing.assert_array_equal(uncounted.spans[0].rows, np.ones((2, 4)))  # type: ignore[union-attr]
    assert not p[:2].has_embeddings and p[:2].position_keys() == [5, 6]
    assert len(p[4:2]) == 0 and (p[:2] + p[2:]).position_keys() == p.position_keys()
    assert Prompt.of_tokens([1, 2]).position_keys() == [1, 2]


def test_a_chunk_takes_a_prompt_or_token_ids() -> None:
    assert Chunk(0, [1, 2], 0).tokens == [1, 2] == Chunk(0, Prompt.of_tokens([1, 2]), 0).tokens
    assert len(Chunk(0, [1, 2], 0)) == 2 and Chunk(0, [1], 0, logits=False).logits == 0
    with pytest.raises(ValueError, match="embedding rows"):
        _ = Chunk(0, Prompt([EmbeddingSpan(np.ones((1, 4), np.float32), "k")]), 0).tokens


def test_span_keys_match_only_the_same_content_key() -> None:
    rows = np.ones((3, 4), np.float32)
    a = Prompt([TokenSpan((1, 2)), EmbeddingSpan(rows, "a"), TokenSpan((3,))]).position_keys()
    same = Prompt([TokenSpan((1, 2)), EmbeddingSpan(rows * 2, "a"), TokenSpan((3,))]).position_keys()
    other = Prompt([TokenSpan((1, 2)), EmbeddingSpan(rows, "b"), TokenSpan((3,))]).position_keys()
    tokens = Prompt.of_tokens([1, 2, 0, 1, 2, 3]).position_keys()  # ids equal to the row indices
    assert common_prefix(a, same) == 6   # the key is the content's identity, not the rows
    assert common_prefix(a, other) == 2
    assert common_prefix(a, tokens) == 2


def test_an_embedding_span_checks_its_rows_and_keeps_them_read_only() -> None:
    rows = np.zeros((2, 4), np.float32)
    span = EmbeddingSpan(rows, "k")
    assert not span.rows.flags.writeable and rows.flags.writeable
    with pytest.raises(ValueError, match="shape"):
        EmbeddingSpan(np.zeros(4, np.float32), "k")
    with pytest.raises(ValueError, match="shape"):
        EmbeddingSpan(np.zeros((0, 4), np.float32), "k")
    with pytest.raises(ValueError, match="non-finite"):
        EmbeddingSpan(np.full((1, 4), np.nan, np.float32), "k")
    with pytest.raises(ValueError, match="content key"):
        EmbeddingSpan(rows, "")
    assert EmbeddingSpan(rows.astype(np.float64), "k").rows.dtype == np.float32


# -- embedding spans through the model ------------------------------------------------------------

def _spans_equal_tokens(model: engine.Model, scale: float = 1.0) -> None:
    """All-rows span, mixed spans, fused and eager: the logits of the tokens, bit for bit (the
    span's rows are the token rows times `scale`)."""
    tr = model.transformer
    ids = model.tokenizer.encode(PROMPT)
    rows = token_rows(model, ids) * np.float32(scale)
    whole = Prompt([EmbeddingSpan(rows, "all of it")])
    mixed = Prompt([TokenSpan(tuple(ids[:3])), EmbeddingSpan(rows[3:9], "middle"),
                    TokenSpan(tuple(ids[9:]))])
    for fwd in (tr.forward, tr.forward_eager):
        fresh(model)
        want = fwd([Chunk(0, ids, 0)], "all")[0]
        got = fwd([Chunk(1, whole, 0), Chunk(2, mixed, 0)], "all")
        np.testing.assert_array_equal(got[0], want)
        np.testing.assert_array_equal(got[1], want)
        # and what they left in the cache serves the next token the same
        nxt = [fwd([Chunk(s, [7], len(ids))], "last")[0] for s in range(3)]
        np.testing.assert_array_equal(nxt[1], nxt[0])
        np.testing.assert_array_equal(nxt[2], nxt[0])


def test_an_embedding_span_of_token_rows_gives_the_tokens_logits(tiny) -> None:
    _spans_equal_tokens(tiny)


def test_a_gemma3_span_is_fed_raw_without_the_token_embedding_scale() -> None:
    # llama.cpp's gemma3 graph scales a batch of token ids by sqrt(n_embd) and a batch of
    # embeddings (an image's) not at all: a span of token rows equals the tokens only when its
    # rows carry the scale already
    with engine.load(SYNTH_DIR / "gemma3_d64_l6_swa8_q8_0.gguf", n_ctx=64, n_threads=2,
                     n_slots=3, flash_attn=False) as gemma:
        scale = gemma.hparams.embed_scale
        assert scale == 8.0
        _spans_equal_tokens(gemma, scale)
        ids = gemma.tokenizer.encode(PROMPT)
        span = Prompt([TokenSpan(tuple(ids[:2])),
                       EmbeddingSpan(token_rows(gemma, ids[2:]) * np.float32(scale), "x")])
        unscaled = Prompt([TokenSpan(tuple(ids[:2])), EmbeddingSpan(token_rows(gemma, ids[2:]), "raw")])
        assert np.abs(gemma.logits(unscaled)[-1] - gemma.logits(ids)[-1]).max() > 0.1
        fresh(gemma)
        want = list(gemma.generate(ids, max_tokens=8, stop_at_eog=False))
        fresh(gemma)
        assert list(gemma.generate(span, max_tokens=8, stop_at_eog=False)) == want  # engine.api


def test_smollm2_gives_a_span_of_its_token_rows_the_tokens_logits(smollm2_path: Path) -> None:
    with engine.load(smollm2_path, n_ctx=64, n_threads=2) as smol:
        ids = smol.tokenizer.encode(PROMPT)
        span = Prompt([TokenSpan(tuple(ids[:4])), EmbeddingSpan(token_rows(smol, ids[4:]), "rest")])
        want = smol.logits(ids)
        np.testing.assert_array_equal(smol.logits(span), want)


def test_spans_whose_rows_do_not_fit_the_model_are_refused(tiny) -> None:
    bad = Prompt([EmbeddingSpan(np.zeros((2, tiny.n_embd + 1), np.float32), "wide")])
    with pytest.raises(ValueError, match="rows of"):
        tiny.transformer.forward([Chunk(0, bad, 0)])
    runner = BatchRunner(tiny)
    with pytest.raises(ValueError, match="rows of"):
        runner.submit(Sequence(bad, params=GREEDY))
    runner.close()


def _run(runner: BatchRunner, *seqs: Sequence) -> None:
    for s in seqs:
        runner.submit(s)
    while any(s.state is not State.FINISHED for s in seqs):
        runner.step()


def test_the_prompt_cache_reuses_the_same_image_and_not_a_different_one(tiny) -> None:
    ids = tiny.tokenizer.encode(PROMPT)
    image_a = token_rows(tiny, ids[::-1][:6])   # rows of a sensible scale, unlike the tokens'
    image_b = token_rows(tiny, ids[1:7])

    def prompt(image: np.ndarray, key: str) -> Prompt:
        return Prompt([TokenSpan(tuple(ids[:4])), EmbeddingSpan(image, key), TokenSpan(tuple(ids[4:8]))])

    fresh(tiny)
    runner = BatchRunner(tiny, sample_threads=1)
    try:
        first = Sequence(prompt(image_a, "a"), params=GREEDY, max_tokens=6, stop_at_eog=False)
        _run(runner, first)
        again = Sequence(prompt(image_a, "a"), params=GREEDY, max_tokens=6, stop_at_eog=False)
        _run(runner, again)
        other = Sequence(prompt(image_b, "b"), params=GREEDY, max_tokens=6, stop_at_eog=False)
        _run(runner, other)
    finally:
        runner.close()
    assert first.cached == 0
    assert again.cached == len(again.prompt) - 1 and again.generated == first.generated
    assert other.cached == 4  # the shared tokens before the image, not the image's rows
    fresh(tiny)
    alone = list(tiny.generate(prompt(image_b, "b"), max_tokens=6, stop_at_eog=False))
    assert other.generated == alone


# -- the last k rows --------------------------------------------------------------------------------

def test_the_last_k_rows_are_the_matching_rows_of_all(tiny) -> None:
    tr = tiny.transformer
    ids = tiny.tokenizer.encode(PROMPT)
    rows = token_rows(tiny, ids[-3:])
    spans = Prompt([TokenSpan(tuple(ids[:-3])), EmbeddingSpan(rows, "tail")])
    for fwd in (tr.forward, tr.forward_eager):
        fresh(tiny)
        every = fwd([Chunk(0, ids, 0)], "all")[0]                            # [n, n_vocab]
        got = fwd([Chunk(1, ids, 0, logits=5), Chunk(2, ids, 0, logits=0),
                   Chunk(3, spans, 0, logits=len(ids))], "last")
        assert got[0].shape == (5, tiny.n_vocab)
        np.testing.assert_array_equal(got[0], every[-5:])
        assert got[1].size == 0
        np.testing.assert_array_equal(got[2], every)
        one = fwd([Chunk(2, [ids[-1]], len(ids) - 1, logits=True)], "last")[0]
        assert one.shape == (tiny.n_vocab,)  # k = 1 keeps the single row's shape
        np.testing.assert_array_equal(one, every[-1])
    with pytest.raises(ValueError, match="last 3"):
        tr.forward([Chunk(0, ids[:2], 0, logits=3)])
