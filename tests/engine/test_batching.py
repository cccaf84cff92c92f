"""Continuous batching (engine/batch.py); tests/gateway/test_batching_served.py serves it.

Part 1 drives BatchRunner over the scripted model (tests/support/scripted_model.py): slot choice, the
prompt cache, shared prompts, the per-step budget, context end, cancellation, failures.
Part 2 uses SmolLM2: a sequence's tokens must not depend on what else is in the batch; the
independent expectation is the engine's own one-sequence path (Model.stream).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine.batch import MIN_PREFILL, BatchRunner, Embedding, Sequence, State, StepError, common_prefix
from engine.sampling import SamplingParams
from tests.support.batch_checks import CHAT_PROMPTS as PROMPTS
from tests.support.batch_checks import alone, assert_same_or_near_tie, run_all
from tests.support.scripted_model import FAIL, SEP, START, ScriptedModel, letters, script

GREEDY = SamplingParams(temperature=0.0)


def text_of(seq: Sequence) -> str:
    return "".join(chr(ord("a") + t - 1) for t in seq.generated)


# ------------------------------------------------------------------ part 1: the runner, scripted

def test_common_prefix_against_a_plain_loop():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = rng.integers(0, 3, rng.integers(0, 12)).tolist()
        b = rng.integers(0, 3, rng.integers(0, 12)).tolist()
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n


def test_prompt_cache_picks_the_slot_holding_the_longest_prefix():
    model = ScriptedModel(n_slots=3)
    runner = BatchRunner(model)
    first = [Sequence([START] + letters(w) + [SEP], params=GREEDY) for w in ("cat", "dog", "owl")]
    for seq in first:
        runner.submit(seq)
    run_all(runner)
    dog_slot = first[1].slot
    # the next turn of the "dog" conversation: its whole history, then a new message
    history = model.transformer.cache.tokens[dog_slot]
    follow = Sequence(history + [0, START] + letters("yes") + [SEP], params=GREEDY)
    runner.submit(follow)
    calls = len(model.calls)
    run_all(runner)
    assert follow.slot == dog_slot and follow.cached == len(history)
    assert text_of(follow) == "yes"
    read = [t for c in model.calls[calls:] for s, t, _ in c.chunks if len(t) > 1]
    assert read == [[0, START] + letters("yes") + [SEP]]  # only the new suffix was evaluated


def test_without_a_common_prefix_the_least_recently_used_slot_is_taken():
    model = ScriptedModel(n_slots=2)
    runner = BatchRunner(model)
    a, b = Sequence(script(letters("aaa")), params=GREEDY), Sequence(script(letters("bbbbbb")), params=GREEDY)
    runner.submit(a)
    runner.submit(b)
    run_all(runner)                     # "aaa" finishes first, so its slot is the older one
    c = Sequence(script(letters("zz")), params=GREEDY)
    runner.submit(c)
    run_all(runner)
    assert c.slot == a.slot and c.cached == 0


def test_identical_prompts_are_read_once_and_copied():
    model = ScriptedModel(n_slots=4, n_ctx=256)
    runner = BatchRunner(model, prefill_budget=16)
    prompt = script(letters("hello" * 10))               # 51 tokens: four steps of 16
    seqs = [Sequence(prompt, params=GREEDY) for _ in range(4)]
    for seq in seqs:
        runner.submit(seq)
    run_all(runner)
    assert [text_of(s) for s in seqs] == ["hello" * 10] * 4
    evaluated = sum(len(t) for c in model.calls for _, t, p in c.chunks if p < len(prompt))
    assert evaluated == len(prompt) + 3                  # one reading + each copy's last token
    assert [n for _, _, n in model.transformer.cache.copies] == [len(prompt) - 1] * 3
    assert [s.cached for s in seqs] == [0] + [len(prompt) - 1] * 3


def test_a_short_common_prefix_is_computed_not_waited_for():
    model = ScriptedModel(n_slots=2, n_ctx=256)
    runner = BatchRunner(model, prefill_budget=8)
    a = Sequence(script(letters("abc" + "x" * 40)), params=GREEDY)
    b = Sequence(script(letters("abc" + "y" * 5)), params=GREEDY)
    runner.submit(a)
    runner.submit(b)
    runner.step()
    assert b.pos > 0                                     # read alongside a from the first step
    run_all(runner)
    assert text_of(a) == "abc" + "x" * 40 and text_of(b) == "abc" + "y" * 5


def test_each_step_is_one_pass_of_decodes_plus_prefill_within_the_budget():
    model = ScriptedModel(n_slots=4, n_ctx=512)
    runner = BatchRunner(model, prefill_budget=64)
    talkers = [Sequence(script(letters(w * 30)), params=GREEDY) for w in "abc"]
    for seq in talkers:
        runner.submit(seq)
    while any(s.state is not State.DECODING for s in talkers):
        runner.step()
    long = Sequence(script(letters("z" * 300)), params=GREEDY)
    runner.submit(long)
    calls = len(model.calls)
    while long.state is State.PREFILLING or long.state is State.WAITING:
        runner.step()
    for call in model.calls[calls:]:
        decodes = [t for _, t, p in call.chunks if len(t) == 1 and p > 0 and t != [SEP]]
        assert len(decodes) == 3                         # every talker advanced in every pass
        assert sum(len(t) for _, t, _ in call.chunks) <= max(64, 3 + MIN_PREFILL)
    assert len(model.calls) - calls == -(-len(long.prompt) // (64 - 3))
    run_all(runner)
    assert [text_of(s) for s in talkers] == [w * 30 for w in "abc"]


def test_with_nothing_decoding_a_step_reads_the_idle_budget():
    model = ScriptedModel(n_slots=9, n_ctx=512)
    runner = BatchRunner(model, prefill_budget=48, idle_budget=96)
    burst = [Sequence(script(letters(w * 9)), params=GREEDY) for w in "abcdefgh"]  # 10 tokens each
    for seq in burst:
        runner.submit(seq)
    runner.step()                                        # nobody decodes: 80 tokens, all eight
    assert [s.state for s in burst] == [State.DECODING] * 8
    long = Sequence(script(letters("z" * 100)), params=GREEDY)
    runner.submit(long)
    runner.step()                                        # eight decode: the budget is 48 - 8
    assert long.pos == 48 - 8
    run_all(runner)
    assert [text_of(s) for s in burst] == [w * 9 for w in "abcdefgh"] and text_of(long) == "z" * 100


def test_a_short_prompt_is_read_before_a_long_one_already_under_way():
    model = ScriptedModel(n_slots=2, n_ctx=512)
    runner = BatchRunner(model, prefill_budget=32)
    long = Sequence(script(letters("z" * 200)), params=GREEDY)
    runner.submit(long)
    runner.step()
    short = Sequence(script(letters("hi")), params=GREEDY)
    runner.submit(short)
    result = runner.step()
    assert short.state is State.DECODING and [s for s, _ in result.sampled] == [short]
    assert long.pos == 32 + (32 - len(short.prompt))      # it got the rest of the budget
    run_all(runner)
    assert text_of(short) == "hi" and text_of(long) == "z" * 200


def test_a_long_prompt_is_not_starved_by_shorter_ones_that_keep_coming():
    """Shortest-first alone would read the short prompts forever; one passed over
    MAX_PASSED_OVER steps in a row is read first in the next."""
    model = ScriptedModel(n_slots=3, n_ctx=512)
    runner = BatchRunner(model, prefill_budget=32)
    long = Sequence(script(letters("z" * 300)), params=GREEDY, max_tokens=1)
    runner.submit(long)
    shorts: list[Sequence] = []
    progress_at = []
    for step in range(60):
        while sum(s.state is not State.FINISHED for s in shorts) < 3:  # always more coming
            first = chr(ord("a") + len(shorts) % 26)  # no prefix to share with the one before
            shorts.append(Sequence(script(letters(first * 39)), params=GREEDY, max_tokens=1))
            runner.submit(shorts[-1])
        before = long.pos
        runner.step()
        if long.pos > before:
            progress_at.append(step)
    gaps = [b - a for a, b in zip([0, *progress_at], progress_at)]
    assert progress_at and max(gaps) <= 3  # MAX_PASSED_OVER (2) steps passed over at most
    assert sum(s.state is State.FINISHED for s in shorts) > 10  # and the short ones flowed


def test_admission_is_first_come_first_served_beyond_the_slots():
    """32 requests on 8 slots, a few cancelled while waiting: the rest take slots in the order
    they came, and every one of them finishes."""
    model = ScriptedModel(n_slots=8, n_ctx=512)
    runner = BatchRunner(model, prefill_budget=64)
    rng = np.random.default_rng(5)
    seqs = [Sequence(script(letters("".join(chr(ord("a") + int(c)) for c in rng.integers(26, size=n)))),
                     params=GREEDY) for n in rng.integers(2, 30, size=32)]
    for seq in seqs:
        runner.submit(seq)
    cancelled = {seqs[12], seqs[20]}
    admitted: list[Sequence] = []
    while runner.busy:
        for seq in cancelled:
            runner.end(seq, "cancelled")
        admitted.extend(runner.step().admitted)  # type: ignore[arg-type]
    assert admitted == [s for s in seqs if s not in cancelled]
    assert all(s.finish_reason == "stop" for s in admitted)


def test_a_full_slot_ends_its_sequence_with_length_and_leaves_the_others_alone():
    model = ScriptedModel(n_slots=2, n_ctx=20)
    runner = BatchRunner(model)
    tight = Sequence(script(letters("abcdefghijklmnopqrstuvwxyz")[:15]), params=GREEDY)  # 16 tokens
    roomy = Sequence(script(letters("xyz")), params=GREEDY)
    runner.submit(tight)
    runner.submit(roomy)
    run_all(runner)
    assert tight.finish_reason == "length" and text_of(tight) == "abcde"  # 4 evaluated + 1 sampled
    assert roomy.finish_reason == "stop" and text_of(roomy) == "xyz"
    assert max(len(t) for t in model.transformer.cache.tokens) <= 20


def test_max_tokens_and_eog():
    runner = BatchRunner(ScriptedModel())
    capped = Sequence(script(letters("abcdef")), params=GREEDY, max_tokens=2)
    eog = Sequence(script(letters("ab")), params=GREEDY)
    raw = Sequence(script(letters("ab")), params=GREEDY, max_tokens=4, stop_at_eog=False)
    for seq in (capped, eog, raw):
        runner.submit(seq)
    run_all(runner)
    assert (text_of(capped), capped.finish_reason) == ("ab", "length")
    assert (text_of(eog), eog.finish_reason) == ("ab", "stop")
    assert raw.generated[:3] == letters("ab") + [0] and raw.finish_reason == "length"


def test_cancelled_sequences_free_their_slot_at_once():
    model = ScriptedModel(n_slots=1, n_ctx=256)
    runner = BatchRunner(model, prefill_budget=16)
    a = Sequence(script(letters("a" * 100)), params=GREEDY)
    b = Sequence(script(letters("b")), params=GREEDY)
    c = Sequence(script(letters("c")), params=GREEDY)
    for seq in (a, b, c):
        runner.submit(seq)
    runner.step()
    runner.end(a, "cancelled")                           # mid-prefill
    runner.end(b, "cancelled")                           # still waiting
    assert (a.state, b.state) == (State.FINISHED, State.FINISHED) and runner.n_active == 0
    run_all(runner)
    assert text_of(c) == "c" and not b.generated
    runner.end(a, "again")                               # idempotent
    assert a.finish_reason == "cancelled"


def test_a_failed_pass_ends_only_the_sequences_in_it():
    model = ScriptedModel(n_slots=1)
    runner = BatchRunner(model)
    bad = Sequence([1, FAIL, SEP], params=GREEDY)
    good = Sequence(script(letters("ok")), params=GREEDY)
    runner.submit(bad)
    runner.submit(good)
    with pytest.raises(StepError) as info:
        runner.step()
    assert info.value.occupants == [bad] and bad.finish_reason == "error"
    assert isinstance(info.value.cause, RuntimeError)
    run_all(runner)
    assert text_of(good) == "ok"


def test_what_could_never_run_is_refused_at_submit():
    runner = BatchRunner(ScriptedModel(n_ctx=8))
    for seq, message in [(Sequence([], params=GREEDY), "no tokens"),
                         (Sequence([1] * 8, params=GREEDY), "context"),
                         (Sequence([1, 200], params=GREEDY), "vocabulary"),
                         (Sequence([1], params=GREEDY, max_tokens=0), "max_tokens")]:
        with pytest.raises(ValueError, match=message):
            runner.submit(seq)
    emb = Embedding([1] * 8)                             # an embedding may fill the context
    runner.submit(emb)
    run_all(runner)
    assert emb.vector is not None


def test_embeddings_share_steps_with_generation():
    model = ScriptedModel(n_slots=2, n_ctx=256)
    runner = BatchRunner(model, prefill_budget=40)
    seq = Sequence(script(letters("abc")), params=GREEDY)
    emb = Embedding(list(range(1, 91)))
    runner.submit(seq)
    runner.submit(emb)
    run_all(runner)
    assert text_of(seq) == "abc"
    mean = np.full(4, 45.5)
    np.testing.assert_allclose(emb.vector, mean / np.linalg.norm(mean), rtol=1e-6)


# ------------------------------------------------------------------ part 2: SmolLM2

N_NEW = 24


@pytest.fixture(scope="module")
def smol(smollm2_path: Path):
    model = engine.load(smollm2_path, n_ctx=2048, n_threads=2, n_slots=8)
    yield model
    model.close()


def chat_ids(model: Any, text: str) -> list[int]:
    rendered = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return list(model.tokenizer.encode(rendered, parse_special=True))


@pytest.mark.slow
def test_greedy_tokens_do_not_depend_on_the_batch(smol):
    prompts = [chat_ids(smol, t) for t in PROMPTS]
    expected = [alone(smol, ids, GREEDY, N_NEW) for ids in prompts]
    runner = BatchRunner(smol, prefill_budget=48)
    seqs = [Sequence(ids, params=GREEDY, max_tokens=N_NEW, stop_at_eog=False) for ids in prompts]
    for seq in seqs[:3]:                    # the rest arrive while these are running
        runner.submit(seq)
    sizes = []
    for i in range(1000):
        if i == 2:
            for seq in seqs[3:]:
                runner.submit(seq)
        if not runner.busy:
            break
        sizes.append(runner.step().n_sequences)
    assert max(sizes) == 8
    for ids, want, seq in zip(prompts, expected, seqs):
        assert len(seq.generated) == N_NEW
        assert_same_or_near_tie(smol, ids, want, seq.generated)
    runner.close()


def test_plain_greedy_batch_path_takes_the_samplers_tokens(smol):
    """Greedy without logprobs goes through engine/batch_greedy.py; with logprobs through each
    Sampler. The same batches, so the same logits: the tokens must be identical, bias included."""
    prompts = [chat_ids(smol, t) for t in PROMPTS]
    bias = {int(t): -100.0 for t in alone(smol, prompts[0], GREEDY, 3)}  # ban some likely tokens

    def run(logprobs: bool) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, logprobs=logprobs, logit_bias=bias)
        runner = BatchRunner(smol, prefill_budget=48)
        seqs = [Sequence(ids, params=params, max_tokens=N_NEW, stop_at_eog=False) for ids in prompts]
        for seq in seqs:
            runner.submit(seq)
        while runner.busy:
            runner.step()
        runner.close()
        return [seq.generated for seq in seqs]
    fast, sampler = run(False), run(True)
    assert fast == sampler
    assert not any(t in bias for gen in fast for t in gen)


@pytest.mark.slow
def test_seeded_sampling_is_reproducible_per_request(smol):
    prompts = [chat_ids(smol, t) for t in PROMPTS]
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i) for i in range(8)]
    expected = [alone(smol, ids, p, N_NEW) for ids, p in zip(prompts, params)]
    runner = BatchRunner(smol)
    seqs = [Sequence(ids, params=p, max_tokens=N_NEW, stop_at_eog=False)
            for ids, p in zip(prompts, params)]
    for seq in reversed(seqs):              # another order, another slot for each
        runner.submit(seq)
    run_all(runner)
    runner.close()
    assert [s.generated for s in seqs] == expected
    assert len({tuple(e) for e in expected}) == 8


def test_shared_prompt_and_prompt_cache_on_the_real_model(smol):
    question = "Which is larger, a whale or an elephant? " + PROMPTS[5]
    ids = chat_ids(smol, question)
    runner = BatchRunner(smol)
    seqs = [Sequence(ids, params=GREEDY, max_tokens=N_NEW, stop_at_eog=False) for _ in range(3)]
    for seq in seqs:
        runner.submit(seq)
    run_all(runner)
    leader, *copies = sorted(seqs, key=lambda s: s.cached)
    assert leader.cached < 8 and [s.cached for s in copies] == [len(ids) - 1] * 2
    expected = alone(smol, ids, GREEDY, N_NEW)
    assert [s.generated for s in seqs] == [expected] * 3
    # the next turn continues the first conversation: only the new part is read
    reply = smol.tokenizer.decode(expected)
    turn2 = list(smol.tokenizer.encode(
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{reply}<|im_end|>\n"
        "<|im_start|>user\nThanks! And at night?<|im_end|>\n<|im_start|>assistant\n",
        parse_special=True))
    follow = Sequence(turn2, params=GREEDY, max_tokens=12, stop_at_eog=False)
    runner.submit(follow)
    run_all(runner)
    runner.close()
    assert follow.cached >= len(ids) - 3
    assert_same_or_near_tie(smol, turn2, alone(smol, turn2, GREEDY, 12), follow.generated)


def test_batched_embedding_equals_the_engine_s(smol):
    ids = chat_ids(smol, PROMPTS[7])
    runner = BatchRunner(smol, prefill_budget=16)
    emb = Embedding(ids)
    seq = Sequence(chat_ids(smol, PROMPTS[0]), params=GREEDY, max_tokens=8)
    runner.submit(seq)
    runner.submit(emb)
    run_all(runner)
    runner.close()
    assert np.array_equal(emb.vector, smol.pooled(ids))
