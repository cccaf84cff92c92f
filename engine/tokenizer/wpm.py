"""WordPiece as llama.cpp runs it (`tokenizer.ggml.model` = bert, its WPM): BERT's vocabularies.

    text -> codepoints -> (strip_accents) each one mapped to the first codepoint of its NFD
         -> words: whitespace ends a word; NUL, U+FFFD and control characters are dropped;
            (strip_accents) combining marks are dropped; (lowercase) lowered; punctuation,
            ASCII symbols and CJK ideographs are words of their own
         -> each word with a phantom space in front ("▁word"), matched greedily longest
            first over its UTF-8 bytes; a word with any unmatched position becomes [UNK]

llama.cpp's WPM always ends a tokenized text (add_special) with the separator token, whatever
add_eos says (llama_vocab::impl::tokenize); the Tokenizer asks `ends_with_sep`. Its "NFD" is
one codepoint for one (unicode.cpp's table: the first codepoint of the decomposition), so an
accented letter becomes its base letter and nothing else. The options come from
tokenizer.ggml.normalizer.lowercase / .strip_accents (both default true; strip_accents follows
lowercase when only that is given).
"""
from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import ClassVar, Self

from .encoder import Encoder, VocabTables
from .metadata import K, flag

PHANTOM_SPACE = "\u2581"

# llama.cpp's unicode_set_whitespace (unicode-data.cpp): what ends a word
_WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                         0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(cpt: int) -> bool:
    return any(a <= cpt <= b for a, b in _CJK)


def _first_nfd(ch: str) -> str:
    return unicodedata.normalize("NFD", ch)[0]


def _lower(ch: str) -> str:
    """The simple lowercase mapping (one codepoint), as unicode_tolower."""
    low = ch.lower()
    return low[0] if low else ch


def split_words(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: the words of `text`, normalized."""
    words: list[str] = [""]
    for ch in text:
        if strip_accents:
            ch = _first_nfd(ch)
        cpt = ord(ch)
        if cpt in _WHITESPACE:
            if words[-1]:
                words.append("")
            continue
        cat = unicodedata.category(ch)
        if cpt == 0 or cpt == 0xFFFD or (cat[0] == "C" and cat != "Cn"):
            continue
        if strip_accents and cat[0] == "M":
            continue
        s = _lower(ch) if lowercase else ch
        if cat[0] == "P" or (cpt < 0x7F and cat[0] == "S") or _is_cjk(cpt):
            if words[-1]:
                words.append("")
            words[-1] = s
            words.append("")
        else:
            words[-1] += s
    if not words[-1]:
        words.pop()
    return words


class WpmEncoder(Encoder):
    """One vocabulary's WordPiece matcher with llama.cpp's defaults for the model: add_bos,
    [SEP] after the text."""

    model = "bert"
    label = "WordPiece"
    default_ids: ClassVar[Mapping[str, int]] = {"bos": 101, "eos": 102, "unk": 100, "sep": 102,
                                                "pad": 0}
    default_add_bos = True
    default_add_sep = True
    ends_with_sep = True

    def __init__(self, id_of: dict[str, int], unk_id: int | None, lowercase: bool,
                 strip_accents: bool) -> None:
        self.unk_id = unk_id
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self._id_of_bytes = {t.encode("utf-8"): i for t, i in id_of.items()}
        self._max_len = max((len(b) for b in self._id_of_bytes), default=0)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, object], vocab: VocabTables,
                      unk_id: int | None) -> Self:
        lowercase = flag(meta, K + "normalizer.lowercase", True)
        strip = flag(meta, K + "normalizer.strip_accents", lowercase)
        return cls(vocab.id_of, unk_id, lowercase, strip)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for word in split_words(text, self.lowercase, self.strip_accents):
            out += self._word(word)
        return out

    def _word(self, word: str) -> list[int]:
        """Greedy longest match over the bytes of "▁word" (llama.cpp matches byte offsets)."""
        data = (PHANTOM_SPACE + word).encode("utf-8")
        n, i, ids = len(data), 0, []
        while i < n:
            for j in range(min(n, i + self._max_len + 1), i, -1):
                tid = self._id_of_bytes.get(data[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                ids = []  # one unmatched position discards the word
                break
        if not ids:
            return [] if self.unk_id is None else [self.unk_id]
        return ids

    def normal_bytes(self, text: str) -> bytes:
        return text.replace(PHANTOM_SPACE, " ").encode("utf-8")
