"""Gemma 3's 262,144-token SentencePiece vocabulary against llama.cpp's own ids.

tests/data/gemma3/tokenize.json holds llama.cpp's tokenization of 60 strings with special parsing
on and off, and each token's piece; the tokenizer is built from the real file's GGUF metadata,
read with gguf-py (not with our reader), so a reader bug cannot hide a tokenizer bug.
"""
from __future__ import annotations

import json

import pytest

from engine.tokenizer import Tokenizer
from tests.support.refs import GEMMA3_DIR

TOKENIZE = json.loads((GEMMA3_DIR / "tokenize.json").read_text())
GREEDY = json.loads((GEMMA3_DIR / "greedy.json").read_text())

pytestmark = [pytest.mark.real_model, pytest.mark.slow]  # loading the vocabulary: ~30 s


@pytest.fixture(scope="module")
def gemma(gemma3_path) -> Tokenizer:
    from gguf import GGUFReader

    reader = GGUFReader(gemma3_path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    return Tokenizer.from_metadata(meta)


def test_gemma3_vocabulary_facts_match_llama_cpp(gemma: Tokenizer) -> None:
    assert gemma.n_vocab == TOKENIZE["n_vocab"] == 262144
    assert gemma.model == TOKENIZE["tokenizer_model"] == "llama"
    assert gemma.pre == TOKENIZE["tokenizer_pre"]
    assert (gemma.bos_id, gemma.eos_id) == (TOKENIZE["bos_id"], TOKENIZE["eos_id"])
    assert gemma.eog_ids == frozenset(TOKENIZE["eog_ids"])
    assert gemma.add_bos is TOKENIZE["add_bos"] is True
    assert gemma.add_space_prefix is False


@pytest.mark.parametrize("item", TOKENIZE["items"], ids=lambda it: repr(it["text"])[:40])
def test_gemma3_encode_decode_matches_llama_cpp(gemma: Tokenizer, item: dict) -> None:
    text = item["text"]
    ids = gemma.encode(text, parse_special=True)
    plain = gemma.encode(text, parse_special=False)
    assert ids == item["ids"]
    assert plain == item["ids_special_false"]
    assert (ids == plain) is item["same_with_special_false"]
    assert [gemma.token_text(i) for i in ids] == item["pieces"]  # the vocabulary's own texts
    assert gemma.decode(ids) == text
    assert gemma.decode(plain) == text
    assert gemma.encode(text, add_special=True, parse_special=True) == [gemma.bos_id, *item["ids"]]


@pytest.mark.parametrize("name", sorted(GREEDY["prompts"]))
def test_gemma3_prompts_tokenize_as_llama_cpp(gemma: Tokenizer, name: str) -> None:
    p = GREEDY["prompts"][name]
    assert gemma.encode(p["prompt"], add_special=True, parse_special=True) == p["prompt_ids"]
    assert gemma.decode(p["raw_ids"]) == p["raw_text"]


def test_gemma3_chat_prompt_tokenizes_as_llama_cpp(gemma: Tokenizer) -> None:
    chat = GREEDY["chat"]
    assert gemma.encode(chat["templated_prompt"], add_special=True, parse_special=True) \
        == chat["prompt_ids"]


def test_gemma3_long_texts_merge_alike_in_the_compiled_and_python_loops(gemma: Tokenizer) -> None:
    """Texts from 256 characters take the compiled SentencePiece merge: the same pieces as the
    Python loop on the real 262k vocabulary (joined llama.cpp strings, runs, mixed scripts)."""
    import random

    from engine.tokenizer.merge import spm_merge
    from engine.tokenizer.spm import SpmEncoder

    spm = gemma._encoder
    assert isinstance(spm, SpmEncoder)
    rng = random.Random(4)
    joined = " ".join(it["text"] for it in TOKENIZE["items"])
    for text in (joined, "a" * 3000, "".join(rng.choice("ab ▁\n日本é") for _ in range(3000)),
                 "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(2000))):
        text = text.replace(" ", "▁")
        python = [(gemma.token_id(p), p) for p in spm_merge(text, gemma._id_of, spm.scores)[0]]
        compiled = spm.compiled_pieces(text)
        assert [(t, p if t is None else "") for t, p in python] == compiled
    # and through encode: the joined strings tokenize as the pieces llama.cpp gave one by one
    assert gemma.decode(gemma.encode(joined)) == joined
