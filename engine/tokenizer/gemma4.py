"""Gemma 4's vocabulary (`tokenizer.ggml.model` = gemma4): SentencePiece-style BPE, as
llama.cpp's llama-vocab.cpp runs it (LLAMA_VOCAB_PRE_TYPE_GEMMA4):

    text fragment -> spaces become U+2581 ("▁", escape_whitespaces)
      -> split into runs of newlines and runs of anything else ("[^\\n]+|[\\n]+": no word
         pre-split, BPE's merge table never holds a newline)
      -> a run of newlines that is itself a token is that token (llama.cpp PR 21343)
      -> otherwise: start from its characters (raw UTF-8, no GPT-2 byte map), merge the
         lowest-ranked adjacent pair first (leftmost on ties), and a merged piece the
         vocabulary lacks falls back to one <0xXX> byte token per UTF-8 byte
    add_bos is always on (llama.cpp overrides a file that says false, PR 21500); decoding
    turns "▁" back into spaces and <0xXX> tokens into their bytes.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Self

import regex

from .encoder import Encoder, VocabTables
from .merge import bpe_merge
from .metadata import K, str_list

SPACE = "\u2581"
_RUNS = regex.compile(r"[^\n]+|[\n]+")
WORD_CACHE_MAX = 100_000  # runs remembered per tokenizer (cleared when full)


class Gemma4Encoder(Encoder):
    model = "gemma4"
    label = "SentencePiece-style BPE (Gemma 4)"
    default_add_bos = True
    forces_add_bos = True
    pre_tokenizer = "gemma4"

    def __init__(self, merges: list[str], id_of: dict[str, int], unk_id: int | None) -> None:
        self._id_of = id_of
        self.unk_id = unk_id
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(merges):
            cut = m.find(" ", 1)  # from 1: the left part may itself be a space
            if cut > 0:
                self._ranks.setdefault((m[:cut], m[cut + 1:]), rank)
        self._byte_ids = [id_of.get(f"<0x{b:02X}>") for b in range(256)]
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, object], vocab: VocabTables,
                      unk_id: int | None) -> Self:
        merges = str_list(meta, K + "merges", required=True)
        assert merges is not None
        return cls(merges, vocab.id_of, unk_id)

    def normal_bytes(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8")

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for run in _RUNS.findall(text.replace(" ", SPACE)):
            ids = self._cache.get(run)
            if ids is None:
                ids = self._run(run)
                if len(self._cache) >= WORD_CACHE_MAX:
                    self._cache.clear()
                self._cache[run] = ids
            out += ids
        return out

    def _run(self, run: str) -> tuple[int, ...]:
        if run[0] == "\n" and (whole := self._id_of.get(run)) is not None:
            return (whole,)
        pieces, _ = bpe_merge(list(run), self._ranks)
        ids: list[int] = []
        for piece in pieces:
            tid = self._id_of.get(piece)
            if tid is not None:
                ids.append(tid)
                continue
            for b in piece.encode("utf-8"):  # not a token: its bytes (a byte without one drops)
                if (byte_id := self._byte_ids[b]) is not None:
                    ids.append(byte_id)
        return tuple(ids)
