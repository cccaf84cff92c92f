"""The reasoning budget (engine/thinking_budget.py): its states over a byte vocabulary, then the
batch forcing the closing tag on the scripted model, whose script says what it would have written.
"""
from __future__ import annotations

from engine.batch import BatchRunner, Sequence
from engine.sampling import SamplingParams
from engine.thinking_budget import Phase, ThinkingBudget
from tests.support.batch_checks import run_all
from tests.support.fake_vocab import ByteVocabulary
from tests.support.scripted_model import SEP, ScriptedModel, letters

VOCAB = ByteVocabulary([])
GREEDY = SamplingParams(temperature=0.0)


def byte_budget(limit: int, inside: bool = False) -> ThinkingBudget:
    return ThinkingBudget(limit, VOCAB.token_bytes, lambda text: list(text.encode()), inside)


def run(budget: ThinkingBudget, text: str) -> str:
    """What the reply becomes when the model wants to write `text` and the budget steers."""
    out = b""
    wanted = list(text.encode())
    while wanted or budget.forced() is not None:
        forced = budget.forced()
        token = forced if forced is not None else wanted.pop(0)
        budget.consume(token)
        out += VOCAB.token_bytes(token)
    return out.decode()


def test_a_block_the_model_opens_is_closed_after_the_limit() -> None:
    assert run(byte_budget(4), "<think>abcdefgh") == "<think>abcd</think>efgh"


def test_a_block_closed_in_time_is_left_alone() -> None:
    budget = byte_budget(40)
    assert run(budget, "<think>ab</think>cd") == "<think>ab</think>cd"
    assert budget.phase is Phase.DONE


def test_a_reply_that_does_not_open_the_block_is_not_touched() -> None:
    assert run(byte_budget(2), "hello <think>abcdef") == "hello <think>abcdef"


def test_leading_whitespace_before_the_block_is_allowed() -> None:
    assert run(byte_budget(2), "\n <think>abcdef") == "\n <think>ab</think>cdef"


def test_a_prompt_that_opened_the_block_counts_from_the_first_token() -> None:
    assert run(byte_budget(3, inside=True), "abcdef") == "abc</think>def"


def test_a_budget_of_zero_closes_the_block_at_once() -> None:
    assert run(byte_budget(0, inside=True), "abc") == "</think>abc"
    assert run(byte_budget(0), "<think>abc") == "<think></think>abc"


def test_a_limit_reached_halfway_through_the_tag_forces_only_its_rest() -> None:
    budget = byte_budget(4, inside=True)
    for byte in b"ab</":
        budget.consume(byte)
    forced = b""
    while (token := budget.forced()) is not None:
        budget.consume(token)
        forced += VOCAB.token_bytes(token)
    assert forced == b"think>" and budget.phase is Phase.DONE


def test_copies_are_independent() -> None:
    first = byte_budget(1, inside=True)
    second = first.copy()
    first.consume(ord("a"))
    assert first.forced() == ord("<") and second.forced() is None


def test_the_batch_forces_the_tag_in_place_of_what_the_model_would_sample() -> None:
    close = 50  # a control token of the scripted vocabulary, standing for </think>
    wanted = letters("abcdef") + [close] + letters("xyz")
    model = ScriptedModel(n_slots=2)
    runner = BatchRunner(model)
    tokenizer = model.tokenizer

    def budgeted(limit: int) -> Sequence:
        budget = ThinkingBudget(limit, tokenizer.token_bytes, lambda text: [close], inside=True,
                                close_tag=tokenizer.token_bytes(close))
        return Sequence(wanted + [SEP], params=GREEDY, max_tokens=len(wanted), budget=budget)

    free, short = Sequence(wanted + [SEP], params=GREEDY, max_tokens=len(wanted)), budgeted(2)
    for seq in (free, short):
        runner.submit(seq)
    run_all(runner)
    assert free.generated == wanted  # unbudgeted, the script as written
    # two thinking tokens, then the tag in place of "c"; after it the model is free again (the
    # scripted one goes on with its script, by position)
    assert short.generated == wanted[:2] + [close] + wanted[3:]
