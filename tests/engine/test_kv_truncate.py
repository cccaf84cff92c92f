"""Rolling a slot's KV cache back (KVCache.truncate, BatchRunner.rollback), rings included.

The oracle is a fresh run: generate, truncate, go on (the same tokens or others) must give the
bits a slot that never saw the rolled-back positions gives. The sliding-window model is the
synthetic gemma3 (window 8) at n_ctx 640, where its local layers keep a ring of
8 + MAX_CHUNK - 1 = 519 rows: the runs below pass the ring's wrap, roll back across it, and
find the exact position before which a rollback cannot be honoured.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import engine
from engine.batch import BatchRunner, Sequence, State
from engine.constraint import TokenizerAdapter, lark_grammar
from engine.kv import MAX_CHUNK, RollbackError
from engine.model import Chunk
from engine.sampling import SamplingParams
from tests.support.ggufgen import write_tiny_llama
from tests.support.refs import SYNTH_DIR

GREEDY = SamplingParams(temperature=0.0)
N_CTX = 640


@pytest.fixture(scope="module")
def gemma():
    with engine.load(SYNTH_DIR / "gemma3_d64_l6_swa8_q8_0.gguf", n_ctx=N_CTX, n_threads=2,
                     n_slots=2, flash_attn=False) as model:
        yield model


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_llama(tmp_path_factory.mktemp("truncate") / "tiny.gguf", qtype=Q.Q8_0)
    with engine.load(path, n_ctx=128, n_threads=2, n_slots=2) as model:
        yield model


def _prompt(model: engine.Model, n: int) -> list[int]:
    return np.random.default_rng(n).integers(0, model.n_vocab, n).tolist()


def _prefill(model: engine.Model, slot: int, ids: list[int]) -> np.ndarray:
    """Read ids into an emptied slot in MAX_CHUNK chunks; the last position's logits."""
    tr = model.transformer
    tr.cache.tokens[slot] = []
    for a in range(0, len(ids), MAX_CHUNK):
        logits = tr.forward([Chunk(slot, ids[a:a + MAX_CHUNK], a)], "last")[0]
    return logits


def _decode(model: engine.Model, slot: int, logits: np.ndarray, pos: int, n: int,
            forced: list[int] | None = None) -> tuple[list[int], list[np.ndarray]]:
    """n greedy steps from `logits` at position pos (or the `forced` tokens): tokens, logits."""
    tokens, seen = [], []
    for i in range(n):
        t = forced[i] if forced is not None else int(np.argmax(logits))
        logits = model.transformer.forward([Chunk(slot, [t], pos + i)], "last")[0]
        tokens.append(t)
        seen.append(logits)
    return tokens, seen


@pytest.mark.parametrize("model_name, n_prompt, back", [
    ("llama", 20, 7),      # a full cache
    ("gemma", 20, 9),      # inside the ring, back past a whole window
    ("gemma", 515, 9),     # past the ring's wrap (519) and back across it
])
def test_generate_truncate_regenerate_is_a_fresh_run(request, model_name: str, n_prompt: int,
                                                     back: int) -> None:
    model = request.getfixturevalue(model_name)
    cache = model.transformer.cache
    ids = _prompt(model, n_prompt)
    first = _prefill(model, 0, ids)
    gen, _ = _decode(model, 0, first, n_prompt, 12)
    held = n_prompt + 12
    cache.truncate(0, held - back)
    kept = gen[:12 - back]
    assert cache.tokens[0] == ids + kept
    # the same tokens again: keep all but the last kept token, which is read again for its logits
    cache.truncate(0, held - back - 1)
    logits = model.transformer.forward([Chunk(0, [kept[-1]], held - back - 1)], "last")[0]
    regen, _ = _decode(model, 0, logits, held - back, back)
    assert kept + regen == gen
    # other tokens after the rollback: a slot that never saw the taken-back ones agrees bit for bit
    cache.truncate(0, held - back)
    other = [(t + 1) % model.n_vocab for t in gen[12 - back:]]
    _, logits_other = _decode(model, 0, np.empty(0), held - back, back, forced=other)
    _prefill(model, 1, ids)
    _decode(model, 1, np.empty(0), n_prompt, 12 - back, forced=kept)
    _, logits_fresh = _decode(model, 1, np.empty(0), held - back, back, forced=other)
    for a, b in zip(logits_other, logits_fresh):
        np.testing.assert_array_equal(a, b)


def test_a_rollback_a_ring_cannot_honour_raises_and_changes_nothing(gemma) -> None:
    cache = gemma.transformer.cache
    ring = next(g for g in cache.layout.groups if g.is_ring)
    assert (ring.ring, ring.window) == (519, 8)
    ids = _prompt(gemma, 526)
    _prefill(gemma, 0, ids)                  # positions 0..525: rows of 0..6 overwritten
    earliest = 526 - ring.ring + ring.window - 1
    assert cache.layout.earliest_resume(526) == earliest == 14
    with pytest.raises(RollbackError, match="cannot roll back to position 13") as err:
        cache.truncate(0, earliest - 1)      # needs position 6's key: overwritten by 525
    assert err.value.earliest == earliest
    assert cache.tokens[0] == ids
    with pytest.raises(ValueError, match="cannot truncate to 527"):
        cache.truncate(0, 527)
    with pytest.raises(ValueError, match="no longer holds the window"):
        gemma.transformer.forward([Chunk(0, [1], earliest - 1)])  # the same rule, one check
    # exactly at the boundary it holds: going on equals a slot that only read ids[:14]
    cache.truncate(0, earliest)
    forced = ids[earliest:earliest + 10]
    _, rolled = _decode(gemma, 0, np.empty(0), earliest, 10, forced=forced)
    _prefill(gemma, 1, ids[:earliest])
    _, fresh = _decode(gemma, 1, np.empty(0), earliest, 10, forced=forced)
    for a, b in zip(rolled, fresh):
        np.testing.assert_array_equal(a, b)
    cache.truncate(0, 0)                     # back to nothing always works
    assert cache.tokens[0] == []


def test_resumable_positions_follow_the_rows_a_ring_still_holds(gemma) -> None:
    """earliest_resume against a simulation of which positions each ring row holds."""
    layout = gemma.transformer.cache.layout
    ring = next(g for g in layout.groups if g.is_ring)
    for written in (0, 9, 300, 518, 519, 520, 526, 700, 1037, 1100):
        holds = {}  # ring row -> the position it holds after writing 0..written-1 in order
        for p in range(written):
            holds[p % ring.ring] = p
        for n in range(written + 1):
            needed = range(max(0, n - ring.window + 1), n)
            intact = all(holds.get(q % ring.ring) == q for q in needed)
            assert layout.resumable(written, n) == intact, (written, n)


# -- the batch runner ------------------------------------------------------------------------------

def _steps_until(runner: BatchRunner, seq: Sequence, n_generated: int) -> None:
    while len(seq.generated) < n_generated and seq.state is not State.FINISHED:
        runner.step()


@pytest.mark.parametrize("n_prompt", [20, 515])
def test_a_rolled_back_sequence_generates_what_a_fresh_one_does(gemma, n_prompt: int) -> None:
    ids = _prompt(gemma, n_prompt)
    runner = BatchRunner(gemma, sample_threads=1)
    try:
        gemma.transformer.cache.tokens[:] = [[], []]
        alone = Sequence(ids, params=GREEDY, max_tokens=12, stop_at_eog=False)
        runner.submit(alone)
        _steps_until(runner, alone, 12)
        gemma.transformer.cache.tokens[:] = [[], []]
        seq = Sequence(ids, params=GREEDY, max_tokens=12, stop_at_eog=False)
        runner.submit(seq)
        _steps_until(runner, seq, 10)
        runner.rollback(seq, 7)
        assert seq.generated == alone.generated[:3] and seq.pending == alone.generated[2]
        _steps_until(runner, seq, 6)
        runner.rollback(seq, 6)              # all of it: the prompt's last token is read again
        assert seq.state is State.PREFILLING and seq.pos == n_prompt - 1
        _steps_until(runner, seq, 12)
        assert seq.generated == alone.generated
        assert seq.state is State.FINISHED and seq.finish_reason == "length"
    finally:
        runner.close()


def test_a_rollback_that_cannot_be_done_is_refused(llama) -> None:
    runner = BatchRunner(llama, sample_threads=1)
    try:
        seq = Sequence([1, 2, 3], params=GREEDY, max_tokens=8, stop_at_eog=False)
        with pytest.raises(ValueError, match="only a decoding sequence"):
            runner.rollback(seq, 1)
        runner.submit(seq)
        _steps_until(runner, seq, 2)
        with pytest.raises(ValueError, match="cannot take back 3 of 2"):
            runner.rollback(seq, 3)
        with pytest.raises(ValueError, match="cannot take back 0"):
            runner.rollback(seq, 0)
        runner.end(seq, "cancelled")
        grammar = TokenizerAdapter.of(llama.tokenizer).compile(lark_grammar("start: /[a-z ]+/"))
        bound = Sequence([1, 2, 3], params=GREEDY, max_tokens=8, constraint=grammar)
        runner.submit(bound)
        _steps_until(runner, bound, 2)
        assert bound.state is State.DECODING
        with pytest.raises(ValueError, match="grammar"):  # a grammar cannot give tokens back
            runner.rollback(bound, 1)
    finally:
        runner.close()


def test_the_sampler_forgets_taken_back_tokens() -> None:
    from engine.sampling import Sampler

    s = Sampler(SamplingParams(temperature=0.0, presence_penalty=5.0), [])
    logits = np.array([1.0, 0.0, 0.0], np.float32)
    assert [s.sample(logits).token for _ in range(2)] == [0, 1]  # 0 penalised once generated
    s.forget([0])
    assert 0 not in s.generated                        # no zero count left for presence to see
    assert s.sample(logits).token == 0                 # 0 is no longer penalised; 1 still is
    s.forget([0, 1])
    assert not s.generated
