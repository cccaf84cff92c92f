"""The fused forward pass (a graph of compiled tasks on the native pool) against its eager twin.

Both paths call the same kernels, so they must agree bit for bit, whatever the thread count,
the batch around a sequence, or the output kind. The pieces only the fused path has (the f16
store, the attention split) are checked against numpy here too.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import engine
from engine.kernels import tasks
from engine.kernels.attention_ir import DEEP_CACHE, DEEP_MIN_QUERIES, TILED_MIN_QUERIES
from engine.model import Chunk
from tests.support.ggufgen import write_tiny_llama
from tests.support.step_checks import fused_and_eager

PROMPT = "hello world, the quick brown fox jumps over the lazy dog"


# -- pieces ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("f16c", [True, False], ids=["f16c", "portable"])
def test_f16_store_rounds_like_numpy(f16c: bool) -> None:
    rng = np.random.default_rng(0)
    edge = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65519.0, 65520.0, 1e9, -1e9, np.inf, -np.inf,
                     6.1035156e-05, 6.0e-05, 5.96e-08, 2.98e-08, 2.99e-08, 1e-10, -3e-6,
                     1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 2049.0, 2051.0], np.float32)
    x = np.concatenate([edge, rng.standard_normal(4000).astype(np.float32) * 100,
                        rng.standard_normal(2000).astype(np.float32) * 1e-5])
    x = np.concatenate([x, np.zeros(-x.size % 8, np.float32)])
    got = tasks.load_tasks(f16c).to_f16(x)
    with np.errstate(over="ignore"):  # the values past f16's range are there on purpose
        want = x.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    nan = tasks.load_tasks(f16c).to_f16(np.full(8, np.nan, np.float32))
    assert np.isnan(nan).all()


@pytest.mark.parametrize("n_threads", [1, 2, 3, 5])
def test_attention_split_covers_every_item_once_in_balanced_runs(n_threads: int) -> None:
    n_head = 9
    cases = [[(1, 0)], [(1, 500)], [(512, 0)], [(1, 100), (1, 3), (30, 0), (64, 12)], [(2, 0)] * 7]
    for chunks in cases:
        seg_start, segs = tasks.split_attention(chunks, n_head, n_threads)
        assert seg_start.shape == (n_threads + 1,) and seg_start[0] == 0
        assert seg_start[-1] == len(segs)
        seen = [np.zeros(n_q * n_head, int) for n_q, _ in chunks]
        costs = []
        for t in range(n_threads):
            cost = 0
            for c, lo, hi in segs[seg_start[t]:seg_start[t + 1]]:
                seen[c][lo:hi] += 1
                _, pos0 = chunks[c]
                cost += sum(pos0 + w // n_head + 1 for w in range(lo, hi))
            costs.append(cost)
        assert all((s == 1).all() for s in seen)
        biggest_item = max(pos0 + n_q for n_q, pos0 in chunks)
        assert max(costs) - min(costs) <= 2 * biggest_item * n_head or sum(costs) < n_threads * biggest_item


# -- the whole pass ----------------------------------------------------------------------------------

def _tiny(tmp: Path, **kw) -> Path:
    return write_tiny_llama(tmp / "tiny.gguf", n_layer=3, **kw)


MODELS = {
    "q8_0": dict(qtype=Q.Q8_0),
    "q4_1+q6_k-output": dict(qtype=Q.Q4_1, output_qtype=Q.Q6_K, tied_output=False, n_embd=256, n_ff=512),
    "f16": dict(qtype=Q.F16),
    "q4_k": dict(qtype=Q.Q4_K, n_embd=256, n_ff=512),
}


@pytest.fixture(scope="module", params=list(MODELS))
def tiny_path(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory.mktemp(request.param), **MODELS[request.param])


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_fused_pass_equals_eager_pass(tiny_path: Path, n_threads: int) -> None:
    with engine.load(tiny_path, n_ctx=160, n_threads=n_threads, n_slots=6) as model:
        model.transformer.governor.choose = lambda kind: n_threads  # every run on all threads
        ids = model.tokenizer.encode(PROMPT)
        long = (ids * 8)[:70]  # >= 64 queries: the exact attention path
        fused_and_eager(model, [
            ([Chunk(0, ids, 0)], "all"),
            ([Chunk(0, [7], len(ids))], "last"),                     # decode
            ([Chunk(1, long, 0), Chunk(0, [9], len(ids) + 1)], "last"),  # prefill beside decode
            ([Chunk(0, [3], len(ids) + 2), Chunk(1, [4], 70), Chunk(2, ids[:5], 0)], "last"),
            ([Chunk(2, [11, 12], 3)], "hidden"),                     # rewrite a slot's tail
            ([Chunk(1, ids, 71)], "all"),
        ])


def test_a_chunk_over_a_deep_cache_takes_the_tiles_in_the_fused_pass(tmp_path: Path) -> None:
    """After DEEP_CACHE cached rows a chunk of DEEP_MIN_QUERIES runs the f32 tiles, as a chunk of
    TILED_MIN_QUERIES does: a row's tiled result does not depend on the rows beside it, so its
    logits equal those rows of the longer chunk's. One query fewer keeps the f16 accumulator,
    whose bits differ."""
    with engine.load(_tiny(tmp_path, qtype=Q.Q8_0), n_ctx=DEEP_CACHE + 128, n_threads=2) as model:
        tr = model.transformer
        ids = model.tokenizer.encode(PROMPT)
        text = (ids * ((DEEP_CACHE + TILED_MIN_QUERIES) // len(ids) + 1))
        for a in range(0, DEEP_CACHE, 256):
            tr.forward([Chunk(0, text[a:a + 256], a, logits=False)], "last")
        after = text[DEEP_CACHE:DEEP_CACHE + TILED_MIN_QUERIES]

        def rows(n: int) -> np.ndarray:
            tr.cache.truncate(0, DEEP_CACHE)
            return tr.forward([Chunk(0, after[:n], DEEP_CACHE)], "all")[0]

        tiled = rows(TILED_MIN_QUERIES)
        np.testing.assert_array_equal(rows(DEEP_MIN_QUERIES), tiled[:DEEP_MIN_QUERIES])
        assert not np.array_equal(rows(DEEP_MIN_QUERIES - 1), tiled[:DEEP_MIN_QUERIES - 1])


def test_a_sequence_gets_the_same_bits_alone_or_batched(tmp_path: Path) -> None:
    path = _tiny(tmp_path, qtype=Q.Q4_0)
    with engine.load(path, n_ctx=128, n_threads=2, n_slots=4) as model:
        tr = model.transformer
        ids = model.tokenizer.encode(PROMPT)
        alone = tr.forward([Chunk(0, ids, 0)], "last")[0]
        step_alone = tr.forward([Chunk(0, [5], len(ids))], "last")[0]
        together = tr.forward([Chunk(2, [1, 2, 3], 0), Chunk(1, ids, 0), Chunk(3, ids[:70], 0)], "last")
        step = tr.forward([Chunk(2, [9], 3), Chunk(1, [5], len(ids))], "last")
        np.testing.assert_array_equal(together[1], alone)
        np.testing.assert_array_equal(step[1], step_alone)


def test_runs_on_fewer_threads_give_the_same_bits(tmp_path: Path) -> None:
    """The governor may run a graph on fewer threads than the pool has: same results."""
    path = _tiny(tmp_path, qtype=Q.Q4_1, n_embd=256, n_ff=512)
    with engine.load(path, n_ctx=128, n_threads=3, n_slots=2) as model:
        tr = model.transformer
        ids = model.tokenizer.encode(PROMPT)
        outs = []
        for threads, slot in ((3, 0), (1, 1)):
            tr.governor.choose = lambda kind, n=threads: n
            outs.append([tr.forward([Chunk(slot, ids, 0)], "all")[0],
                         tr.forward([Chunk(slot, [3], len(ids))], "last")[0]])
        for a, b in zip(*outs):
            np.testing.assert_array_equal(a, b)


def test_scratch_grows_with_the_batch(tmp_path: Path) -> None:
    """A call bigger than any before it gets new buffers (and graphs pointing at them)."""
    path = _tiny(tmp_path, qtype=Q.Q8_0)
    with engine.load(path, n_ctx=256, n_threads=2, n_slots=2) as model:
        ids = (model.tokenizer.encode(PROMPT) * 20)[:200]
        fused_and_eager(model, [([Chunk(0, ids[:1], 0)], "last"), ([Chunk(0, ids, 0)], "all"),
                                 ([Chunk(0, [1], 200)], "last")])


def test_bad_chunks_are_clear_errors(tmp_path: Path) -> None:
    path = _tiny(tmp_path, qtype=Q.Q8_0)
    with engine.load(path, n_ctx=32, n_threads=2, n_slots=2) as model:
        tr = model.transformer
        with pytest.raises(ValueError, match="same slot"):
            tr.forward([Chunk(0, [1], 0), Chunk(0, [2], 0)])
        with pytest.raises(ValueError, match="slot 5 does not exist"):
            tr.forward([Chunk(5, [1], 0)])
        with pytest.raises(ValueError, match="cannot append at 3"):
            tr.forward([Chunk(1, [1], 3)])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tr.forward([Chunk(1, [10 ** 6], 0)])
        with pytest.raises(engine.ContextOverflowError):
            tr.forward([Chunk(1, [1] * 33, 0)])
        with pytest.raises(ValueError, match="output kind"):
            tr.forward([Chunk(1, [1], 0)], "logits")
        assert tr.cache.tokens == [[], []]  # nothing ran


def test_close_stops_the_pool_threads(tmp_path: Path) -> None:
    path = _tiny(tmp_path, qtype=Q.Q8_0)
    before = {t for t in threading.enumerate() if t.name.startswith("modelyard-pool")}
    model = engine.load(path, n_ctx=32, n_threads=3)
    started = {t for t in threading.enumerate() if t.name.startswith("modelyard-pool")} - before
    assert len(started) == 2
    list(model.generate(model.tokenizer.encode(PROMPT), max_tokens=3))
    model.close()
    assert not any(t.is_alive() for t in started)
