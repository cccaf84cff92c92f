"""What a vocabulary model (`tokenizer.ggml.model`) is to the Tokenizer: one Encoder subclass.

    Tokenizer (engine/tokenizer/vocab.py): tokens, special tokens, BOS/EOS, decoding
       | ENCODERS[tokenizer.ggml.model].from_metadata(meta, vocab, unk_id)
    Encoder: the model's defaults (special ids, add_bos, the space prefix), text fragments ->
             ids, a normal token's text -> its bytes
       gpt2   BpeEncoder  (engine/tokenizer/bpe.py)
       llama  SpmEncoder  (engine/tokenizer/spm.py)
       gemma4 Gemma4Encoder (engine/tokenizer/gemma4.py)
       bert   WpmEncoder  (engine/tokenizer/wpm.py)

A new vocabulary model (llama.cpp's WPM, UGM, RWKV...) is a subclass and one entry in
engine/tokenizer/vocab.py's ENCODERS; the Tokenizer names no model.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Self


@dataclass(frozen=True)
class VocabTables:
    """The vocabulary as the Tokenizer read it, shared with its encoder (not copied)."""
    texts: list[str]            # token text by id ("" renamed as llama.cpp does)
    scores: list[float]         # tokenizer.ggml.scores (0.0 when absent)
    id_of: dict[str, int]       # token text -> id


class Encoder(ABC):
    """One vocabulary's encoder; thread-safe (what it builds on first use, racing threads
    build alike, and either copy serves)."""

    model: ClassVar[str]                           # its tokenizer.ggml.model
    label: ClassVar[str]                           # what it is, for messages
    default_ids: ClassVar[Mapping[str, int]] = {}  # special token ids presumed by the model
    default_add_bos: bool = False                  # add_bos_token when the file does not say
    forces_add_bos: bool = False                   # BOS even where the file says not (gemma4)
    default_add_sep: bool = False                  # add_sep_token when the file does not say
    ends_with_sep: bool = False                    # add_special ends a text with the separator
    #                                                (llama.cpp's WPM), not with EOS
    add_space_prefix: bool = False                 # a space before the text (decode drops it)
    pre_tokenizer: str | None = None               # the pre-tokenizer's name, if it has one

    @classmethod
    @abstractmethod
    def from_metadata(cls, meta: Mapping[str, object], vocab: VocabTables,
                      unk_id: int | None) -> Self:
        """The encoder for this file (its model-specific keys read here: ValueError if bad)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens in it)."""

    @abstractmethod
    def normal_bytes(self, text: str) -> bytes:
        """A normal token's raw bytes from its stored text."""

    def encode_fragments(self, fragments: Iterable[str | int]) -> list[int]:
        """Ids of text with its special tokens already cut out (the ints)."""
        out: list[int] = []
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                out += self.encode(frag)
        return out
