"""The vocabulary model seam (engine/tokenizer/encoder.py): the Tokenizer takes its encoder from
ENCODERS by tokenizer.ggml.model, so a new model is a subclass and one table entry. A toy model
(one token per character) shows the Tokenizer's own work around it: special tokens cut out,
BOS added, the model's defaults and byte rendering used, decode inverting encode."""
from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Self

import pytest

from engine.tokenizer import ENCODERS, Encoder, Tokenizer, vocabulary_model
from engine.tokenizer.encoder import VocabTables

TOKENS = ["<unk>", "<s>", "a", "b", " ", "é"]


class CharEncoder(Encoder):
    model = "chars"
    label = "one token per character"
    default_ids: ClassVar[Mapping[str, int]] = {"unk": 0, "bos": 1}
    default_add_bos = True

    def __init__(self, id_of: dict[str, int], unk_id: int | None) -> None:
        self.id_of, self.unk_id = id_of, unk_id

    @classmethod
    def from_metadata(cls, meta: Mapping[str, object], vocab: VocabTables,
                      unk_id: int | None) -> Self:
        return cls(vocab.id_of, unk_id)

    def encode(self, text: str) -> list[int]:
        return [self.id_of.get(c, self.unk_id or 0) for c in text]

    def normal_bytes(self, text: str) -> bytes:
        return text.encode("utf-8")


def _meta(model: str) -> dict[str, object]:
    return {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": TOKENS,
            "tokenizer.ggml.token_type": [2, 3, 1, 1, 1, 1]}


def test_a_new_vocabulary_model_is_one_table_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"unsupported tokenizer model 'chars'.*'gpt2' "
                                         r"\(byte-level BPE\), 'llama' \(SentencePiece\)"):
        vocabulary_model(_meta("chars"))
    monkeypatch.setitem(ENCODERS, "chars", CharEncoder)
    tok = Tokenizer.from_metadata(_meta("chars"))
    assert isinstance(tok._encoder, CharEncoder) and tok.model == "chars"
    assert (tok.bos_id, tok.unk_id, tok.add_bos, tok.add_space_prefix) == (1, 0, True, False)
    text = "ab é<s>ba"
    ids = tok.encode(text, add_special=True, parse_special=True)
    pieces = ["<s>", *"ab é", "<s>", *"ba"]                   # BOS, the text with <s> cut out
    assert ids == [TOKENS.index(p) for p in pieces]
    assert tok.encode("c") == [0]                              # the model's unknown fallback
    assert tok.decode(ids, skip_special=True) == text.replace("<s>", "")
    assert tok.decode(ids) == "<s>" + text
