"""engine.loaded's protocols: the engine's model and the scheduler tests' stand-in both meet them.

mypy checks the signatures (engine/loaded.py for engine.Model, tests/support/scripted_model.py for the
stand-in); these tests check, at run time, that every member is there on real instances.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import engine
from engine.loaded import LoadedModel, ModelTokenizer
from tests.support.ggufgen import write_tiny_llama
from tests.support.scripted_model import ScriptedModel, letters

MEMBERS = ("path", "metadata", "n_ctx", "n_slots", "n_vocab", "n_embd", "memory_bytes",
           "mapped_bytes", "tokenizer", "transformer", "is_encoder", "pooling", "role", "pool",
           "file_changed", "close")


def test_a_loaded_engine_model_meets_the_protocol(tmp_path: Path) -> None:
    with engine.load(write_tiny_llama(tmp_path / "tiny.gguf"), n_ctx=64, n_slots=2) as model:
        assert isinstance(model, LoadedModel)
        assert isinstance(model.tokenizer, ModelTokenizer)
        assert model.file_changed() is None and model.n_slots == 2


def test_the_scripted_stand_in_meets_the_protocol() -> None:
    model = ScriptedModel(n_slots=3)
    assert isinstance(model, LoadedModel)
    assert isinstance(model.tokenizer, ModelTokenizer)


def test_an_object_missing_a_member_does_not() -> None:
    model = ScriptedModel()
    for missing in MEMBERS:
        partial = SimpleNamespace(**{m: getattr(model, m) for m in MEMBERS if m != missing})
        assert not isinstance(partial, LoadedModel), missing
    assert isinstance(SimpleNamespace(**{m: getattr(model, m) for m in MEMBERS}), LoadedModel)


def test_the_scripted_tokenizer_round_trips_letters_and_names_control_tokens() -> None:
    tok = ScriptedModel().tokenizer
    assert tok.encode("hello") == letters("hello")
    assert tok.decode(tok.encode("hello")) == "hello"
    assert tok.token_id("<0>") == 0 and tok.is_special(0) and not tok.is_special(letters("a")[0])
    assert tok.decode([*letters("hi"), 0], skip_special=True) == "hi"
