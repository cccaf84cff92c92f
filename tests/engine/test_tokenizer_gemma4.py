"""Gemma 4's vocabulary model (engine/tokenizer/gemma4.py) against llama.cpp's own tokenizer:
a tiny `gemma4` vocabulary and the ids llama-server's /tokenize gave for sample texts
(tests/data/synth3/gemma4_vocab.json, made by scripts/make_gemma4_vocab_ref.py). The samples
exercise llama.cpp's rules: spaces as U+2581 with no word pre-split, merges by rank over
characters, newline runs apart (a run that is no token splits per character), <0xXX> byte
fallback, user-defined markers cut out, BOS added although the file says not."""
from __future__ import annotations

import json

import pytest

from engine.tokenizer import Tokenizer
from tests.support.refs import SYNTH3_DIR

REF = json.loads((SYNTH3_DIR / "gemma4_vocab.json").read_text())


def _tokenizer() -> Tokenizer:
    k = "tokenizer.ggml."
    return Tokenizer.from_metadata({
        k + "model": "gemma4", k + "tokens": REF["tokens"], k + "token_type": REF["token_type"],
        k + "merges": REF["merges"], k + "bos_token_id": REF["bos_token_id"],
        k + "eos_token_id": REF["eos_token_id"], k + "unknown_token_id": REF["unknown_token_id"],
        k + "padding_token_id": REF["padding_token_id"], k + "add_bos_token": REF["add_bos_token"]})


@pytest.mark.parametrize("sample", REF["samples"], ids=lambda s: repr(s["text"])[:24])
def test_ids_are_llama_cpps(sample: dict) -> None:
    tok = _tokenizer()
    assert tok.encode(sample["text"], add_special=True, parse_special=True) == sample["ids"]


def test_bos_is_added_although_the_file_says_not_and_decode_inverts() -> None:
    tok = _tokenizer()
    assert REF["add_bos_token"] is False and tok.add_bos and tok.model == "gemma4"
    for sample in REF["samples"]:  # "▁" back to spaces, <0xXX> back to UTF-8, markers kept
        assert sample["ids"][0] == tok.bos_id
        assert tok.decode(sample["ids"][1:]) == sample["text"]
