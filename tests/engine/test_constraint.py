"""Constrained decoding: llguidance masks, the sampler applying them, the batch advancing them.

Expectations are independent of llguidance's own answers: the tokens a tiny regular grammar
allows are listed by hand over a byte vocabulary; batched masks must equal one-at-a-time masks;
generated text must parse with `json`/`re` and validate with `jsonschema`; an unconstrained
sequence must produce the same tokens beside constrained ones as alone.
"""
from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

import engine
from engine import batch
from engine.constraint import (
    ConstraintError,
    MaskFiller,
    TokenizerAdapter,
    gbnf_grammar,
    json_schema_grammar,
    lark_grammar,
)
from engine.sampling import NonFiniteLogitsError, Sampler, SamplingParams
from tests.support.fake_vocab import ByteVocabulary
from tests.support.ggufgen import write_tiny_llama

VOCAB = ByteVocabulary(["<|python_tag|>"])


@pytest.fixture(scope="module")
def adapter() -> TokenizerAdapter:
    return TokenizerAdapter(VOCAB)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> engine.Model:
    path = write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", seed=3)
    model = engine.load(path, n_ctx=256, n_threads=1, n_slots=4)
    yield model
    model.close()


def allowed_set(mask: np.ndarray) -> set[int]:
    return {int(i) for i in np.flatnonzero(mask)}


def test_the_mask_allows_exactly_the_bytes_a_grammar_can_continue_with(adapter):
    c = adapter.compile(lark_grammar('start: /[ab]c[0-9]/'))
    assert allowed_set(c.allowed()) == {ord("a"), ord("b")}
    assert c.consume(ord("b"))
    assert allowed_set(c.allowed()) == {ord("c")}
    assert c.consume(ord("c"))
    assert allowed_set(c.allowed()) == set(range(ord("0"), ord("9") + 1))
    assert c.consume(ord("7"))
    assert c.done and c.accepting


def test_end_of_generation_is_allowed_only_where_the_grammar_may_end(adapter):
    c = adapter.compile(lark_grammar('start: "x" "y"?'))
    assert VOCAB.eos_id not in allowed_set(c.allowed())
    c.consume(ord("x"))
    assert allowed_set(c.allowed()) == {ord("y"), VOCAB.eos_id}


def test_control_tokens_are_matched_by_id_never_by_their_text(adapter):
    tag = VOCAB.special_id("<|python_tag|>")
    c = adapter.compile(lark_grammar(f'start: <[{tag}]> "1"'))
    assert allowed_set(c.allowed()) == {tag}
    literal = adapter.compile(lark_grammar('start: "<|python_tag|>"'))
    assert allowed_set(literal.allowed()) == {ord("<")}


def test_batched_masks_equal_one_at_a_time_masks(adapter):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    base = adapter.compile(json_schema_grammar(schema))
    states = [base.copy() for _ in range(5)]
    for k, c in enumerate(states):  # five different positions in the same grammar
        for t in VOCAB.encode('{"n": 12'[:k + 1]):
            assert c.consume(t)
    together = [m.copy() for m in MaskFiller(threads=2).fill(states)]
    alone = [c.allowed() for c in states]
    for a, b in zip(together, alone):
        assert np.array_equal(a, b)
    assert len({tuple(np.flatnonzero(m)) for m in alone}) > 2  # the positions really differ


def test_copies_are_independent(adapter):
    a = adapter.compile(lark_grammar('start: "ab" | "ac"'))
    b = a.copy()
    a.consume(ord("a"))
    assert allowed_set(b.allowed()) == {ord("a")}
    assert allowed_set(a.allowed()) == {ord("b"), ord("c")}


@pytest.mark.parametrize("grammar", [
    lambda: json_schema_grammar({"type": "object", "properties": {"a": {"type": "strin"}}}),
    lambda: json_schema_grammar({"type": "string", "pattern": "(?<=x)a"}),
    lambda: lark_grammar("start: undefined_rule"),
])
def test_grammars_that_do_not_compile_raise_constraint_error(adapter, grammar):
    with pytest.raises(ConstraintError):
        adapter.compile(grammar())


def test_gbnf_converts_and_bad_gbnf_is_a_constraint_error(adapter):
    c = adapter.compile(gbnf_grammar('root ::= "yes" | "no"'))
    assert allowed_set(c.allowed()) == {ord("y"), ord("n")}
    with pytest.raises(ConstraintError):
        adapter.compile(gbnf_grammar("root ::= ("))


def test_the_adapter_is_built_once_per_tokenizer():
    assert TokenizerAdapter.of(VOCAB) is TokenizerAdapter.of(VOCAB)


# ------------------------------------------------------------------ the sampler

def test_the_mask_comes_before_bias_and_temperature():
    logits = np.zeros(8, dtype=np.float32)
    allowed = np.zeros(8, dtype=bool)
    allowed[[2, 5]] = True
    params = SamplingParams(temperature=1.5, logit_bias={0: 100.0, 1: 100.0}, seed=1)
    sampler = Sampler(params)
    assert {sampler.sample(logits, allowed).token for _ in range(50)} == {2, 5}
    greedy = Sampler(SamplingParams(temperature=0.0, logit_bias={7: 100.0}))
    assert greedy.sample(logits, allowed).token in (2, 5)


def test_a_mask_that_allows_nothing_is_an_error_not_a_token():
    with pytest.raises(NonFiniteLogitsError, match="grammar"):
        Sampler(SamplingParams(temperature=0.0)).sample(np.zeros(4, np.float32),
                                                         np.zeros(4, dtype=bool))


def test_reported_logprobs_stay_the_models_own():
    logits = np.array([3.0, 1.0, 0.0, -1.0], dtype=np.float32)
    allowed = np.array([False, True, True, False])
    s = Sampler(SamplingParams(temperature=0.0)).sample(logits, allowed)
    expected = 1.0 - np.log(np.exp(logits.astype(np.float64)).sum())
    assert s.token == 1 and s.logprob == pytest.approx(expected, abs=1e-5)


# ------------------------------------------------------------------ in the batch

def run(model: engine.Model, seqs: list[batch.Sequence]) -> None:
    runner = batch.BatchRunner(model, sample_threads=1)
    for s in seqs:
        runner.submit(s)
    while runner.busy:
        runner.step()
    runner.close()


SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 3}},
    "required": ["id", "tags"], "additionalProperties": False}


def test_constrained_sequences_follow_their_schema_and_stop_when_it_is_complete(tiny):
    adapter = TokenizerAdapter.of(tiny.tokenizer)
    base = adapter.compile(json_schema_grammar(SCHEMA))
    prompt = tiny.tokenizer.encode("hello world")
    seqs = [batch.Sequence(prompt, params=SamplingParams(temperature=1.0, seed=i),
                           max_tokens=200, constraint=base.copy()) for i in range(3)]
    run(tiny, seqs)
    for s in seqs:
        assert s.finish_reason == "stop"
        jsonschema.validate(json.loads(tiny.tokenizer.decode(s.generated)), SCHEMA)


def test_an_unconstrained_sequence_is_unaffected_by_constrained_company(tiny):
    adapter = TokenizerAdapter.of(tiny.tokenizer)
    prompt = tiny.tokenizer.encode("the quick brown fox")
    params = SamplingParams(temperature=0.8, seed=7)
    alone = batch.Sequence(prompt, params=params, max_tokens=20, stop_at_eog=False)
    run(tiny, [alone])
    beside = batch.Sequence(prompt, params=params, max_tokens=20, stop_at_eog=False)
    company = [batch.Sequence(prompt, params=SamplingParams(temperature=0.0), max_tokens=20,
                              constraint=adapter.compile(lark_grammar(r"start: /[a-z ]{1,40}\./")))
               for _ in range(2)]
    run(tiny, [company[0], beside, company[1]])
    assert beside.generated == alone.generated
    for c in company:
        assert re.fullmatch(r"[a-z ]{1,40}\.", tiny.tokenizer.decode(c.generated))


def test_model_stream_follows_a_constraint_too(tiny):
    adapter = TokenizerAdapter.of(tiny.tokenizer)
    c = adapter.compile(json_schema_grammar(SCHEMA))
    ids = tiny.tokenizer.encode("hello world")
    tokens = [s.token for s in tiny.stream(ids, SamplingParams(temperature=1.0, seed=4), 200,
                                           constraint=c)]
    assert c.done
    jsonschema.validate(json.loads(tiny.tokenizer.decode(tokens)), SCHEMA)
