"""Byte-level BPE (`tokenizer.ggml.model` = gpt2): pre-tokenize, map bytes, merge by rank.

    text -> pre-tokenizer words (engine/tokenizer/pretokenizers.py) -> per word, cached:
      UTF-8 bytes -> GPT-2's printable byte symbols -> merges, lowest rank first -> token ids

Short words merge in Python (engine/tokenizer/merge.py's bpe_merge), long ones in its compiled
twin (engine/kernels/merge.py); both give the same ids (tested).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from .encoder import Encoder, VocabTables
from .merge import CompiledBpe, bpe_merge
from .metadata import K, str_list
from .pretokenizers import PreTokenizer, choose_pre_tokenizer, compiled_patterns, split_words

WORD_CACHE_MAX = 200_000  # pre-token words remembered per tokenizer (cleared when full)
COMPILED_MERGE_MIN = 48  # words this long merge in the compiled loop (shorter: the call costs more)


def _byte_chars() -> list[str]:
    """GPT-2's reversible byte -> printable character map.

    Bytes that are printable Latin-1 characters stand for themselves; the other 68 (controls,
    space, DEL, NBSP, soft hyphen...) take U+0100, U+0101, ... in byte order.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars, n_moved = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(0x100 + n_moved))
            n_moved += 1
    return chars


BYTE_CHARS = _byte_chars()
_CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}
_LATIN1_TO_BYTE_CHARS = str.maketrans(dict(enumerate(BYTE_CHARS)))


def byte_encode(word: str) -> str:
    # UTF-8 bytes seen as Latin-1 characters, then translated in one C-level pass
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)


def byte_decode(text: str) -> bytes:
    out = bytearray()
    for c in text:
        b = _CHAR_BYTES.get(c)
        if b is None:
            out += c.encode("utf-8")  # not a byte symbol: keep the character itself
        else:
            out.append(b)
    return bytes(out)


class BpeEncoder(Encoder):
    """One vocabulary's BPE; its pre-tokenizer (tokenizer.ggml.pre) decides add_bos's default."""

    model = "gpt2"
    label = "byte-level BPE"

    def __init__(self, pre: PreTokenizer, merges: list[str], id_of: dict[str, int],
                 n_vocab: int, unk_id: int | None) -> None:
        self.pre = pre
        self.pre_tokenizer = pre.name
        self.default_add_bos = pre.add_bos
        self.patterns = compiled_patterns(pre)
        self.n_vocab = n_vocab
        self.unk_id = unk_id
        self._id_of = id_of
        self._merges: list[str] | None = merges  # ranked when first used
        self._ranks_built: dict[tuple[str, str], int] | None = None
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._compiled_bpe: CompiledBpe | None = None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, object], vocab: VocabTables,
                      unk_id: int | None) -> Self:
        merges = str_list(meta, K + "merges", required=True)
        assert merges is not None
        return cls(choose_pre_tokenizer(meta.get(K + "pre")), merges, vocab.id_of,
                   len(vocab.texts), unk_id)

    def normal_bytes(self, text: str) -> bytes:
        return byte_decode(text)

    @property
    def _ranks(self) -> dict[tuple[str, str], int]:
        """Merge pair -> rank, built on first use: ~50k merges take ~30 ms, which a model load
        need not pay (two threads racing here build equal dicts; either one is kept)."""
        ranks = self._ranks_built
        if ranks is None:
            ranks = {}
            for rank, m in enumerate(self._merges or ()):
                cut = m.find(" ", 1)  # from 1: the left part may itself be a space
                if cut > 0:
                    ranks.setdefault((m[:cut], m[cut + 1:]), rank)  # first occurrence wins
            self._ranks_built = ranks
            self._merges = None
        return ranks

    def encode(self, text: str) -> list[int]:
        """Token ids of text without special tokens."""
        out: list[int] = []
        cache = self._word_cache
        for word in split_words(text, self.patterns):
            ids = cache.get(word)
            if ids is None:
                if len(word) >= COMPILED_MERGE_MIN and not (
                        self.pre.ignore_merges and byte_encode(word) in self._id_of):
                    ids = self.long_word(word)
                else:
                    ids = self.word(byte_encode(word))
                if len(cache) >= WORD_CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out += ids
        return out

    def word(self, word: str) -> tuple[int, ...]:
        """Merge one byte-encoded word: always the lowest-ranked adjacent pair, leftmost first
        (the order llama.cpp's priority queue pops them in)."""
        if self.pre.ignore_merges and word in self._id_of:
            return (self._id_of[word],)
        parts, _ = bpe_merge(word, self._ranks)
        ids: list[int] = []
        for p in parts:
            tid = self._id_of.get(p)
            if tid is not None:
                ids.append(tid)
                continue
            for c in p:  # a merge result missing from the vocabulary: fall back to byte symbols
                tid = self._id_of.get(c, self.unk_id)
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    def long_word(self, word: str) -> tuple[int, ...]:
        """word() in the compiled merge loop (a Python merge costs ~2 us)."""
        merger = self._compiled_bpe
        if merger is None:
            merger = self._compiled_bpe = CompiledBpe(self._ranks, self._id_of, self.n_vocab,
                                                      BYTE_CHARS)
        symbols, _ = merger.merge(word.encode("utf-8"))
        if max(symbols) < self.n_vocab:
            return tuple(symbols)
        ids: list[int] = []
        for s in symbols:
            if s < self.n_vocab:
                ids.append(s)
                continue
            for c in merger.text(s):  # a merge result missing from the vocabulary: byte symbols
                tid = self._id_of.get(c, self.unk_id)
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)
