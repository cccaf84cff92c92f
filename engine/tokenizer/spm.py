"""SentencePiece as llama.cpp runs it (`tokenizer.ggml.model` = llama, its SPM).

    text (spaces already U+2581) -> single characters -> merge the adjacent pair whose
    concatenation is the highest-scoring token (leftmost on ties) -> characters no token covers
    fall back to <0xXX> byte tokens (or the unknown token)

Short texts merge in Python (engine/tokenizer/merge.py's spm_merge), long ones in its compiled
twin (engine/kernels/merge_spm.py); both give the same ids (tested).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, ClassVar, Self

from .encoder import Encoder, VocabTables
from .merge import spm_merge
from .metadata import K, flag

if TYPE_CHECKING:
    from ..kernels.merge_spm import SpmVocab

COMPILED_SPM_MIN = 256  # texts this long merge in the compiled loop (shorter: the call costs more)
SPM_SPACE = "\u2581"  # SentencePiece's visible space, "▁"


class SpmEncoder(Encoder):
    """One vocabulary's SentencePiece merges, with llama.cpp's defaults for the model: BOS 1,
    EOS 2, UNK 0, add_bos, and a space before the text (tokenizer.ggml.add_space_prefix)."""

    model = "llama"
    label = "SentencePiece"
    default_ids: ClassVar[Mapping[str, int]] = {"bos": 1, "eos": 2, "unk": 0}
    default_add_bos = True

    def __init__(self, texts: list[str], scores: list[float], id_of: dict[str, int],
                 unk_id: int | None, add_space_prefix: bool = True) -> None:
        self.add_space_prefix = add_space_prefix
        self.scores = scores
        self.unk_id = unk_id
        self._texts = texts
        self._id_of = id_of
        self._byte_ids = [id_of.get(f"<0x{b:02X}>", id_of.get(chr(b)) if b < 0x80 else None)
                          for b in range(256)]
        self._spm_vocab: SpmVocab | None = None  # built when a long text first needs it

    @classmethod
    def from_metadata(cls, meta: Mapping[str, object], vocab: VocabTables,
                      unk_id: int | None) -> Self:
        return cls(vocab.texts, vocab.scores, vocab.id_of, unk_id,
                   flag(meta, K + "add_space_prefix", True))

    def encode_fragments(self, fragments: Iterable[str | int]) -> list[int]:
        """Spaces become U+2581; with add_space_prefix, the text after the start or after a
        special token gets a space in front (llama.cpp's tokenizer_st_partition order)."""
        out: list[int] = []
        after_special = True  # the text start counts as "after a special token"
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
                continue
            if self.add_space_prefix and after_special:
                frag = " " + frag
            out += self.encode(frag.replace(" ", SPM_SPACE))
            after_special = False
        return out

    def normal_bytes(self, text: str) -> bytes:
        return text.replace(SPM_SPACE, " ").encode("utf-8")

    def encode(self, text: str) -> list[int]:
        """llama.cpp's SPM: start from single characters; repeatedly merge the adjacent pair whose
        concatenation is a token with the highest score (leftmost on ties); characters left
        without a token become <0xXX> byte tokens."""
        id_of = self._id_of
        if len(text) >= COMPILED_SPM_MIN:
            pieces = self.compiled_pieces(text)
        else:
            pieces = [(id_of.get(p), p) for p in spm_merge(text, id_of, self.scores)[0]]
        out: list[int] = []
        for tid, piece in pieces:
            if tid is not None:
                out.append(tid)
            else:
                for b in piece.encode("utf-8"):
                    bid = self._byte_ids[b]
                    if bid is None:
                        bid = self.unk_id
                    if bid is not None:
                        out.append(bid)
        return out

    def compiled_pieces(self, text: str) -> list[tuple[int | None, str]]:
        """spm_merge in the compiled loop: (token id, or None and the lone character)."""
        from ..kernels.merge_spm import SpmVocab
        from ..kernels.merge_spm import spm_merge as compiled_spm_merge

        vocab = self._spm_vocab
        if vocab is None:  # ~0.3 s for 262k tokens, paid by the first long text, not the load
            vocab = self._spm_vocab = SpmVocab(self._texts, self.scores)
        symbols, _ = compiled_spm_merge(text, vocab)
        return [(tid, "") if tid >= 0 else (None, text[start]) for tid, start in symbols]
