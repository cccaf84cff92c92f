"""One GGUF vocabulary: `tokenizer.ggml.*` metadata read with clear errors, special tokens
found as llama.cpp finds them, and text <-> token ids.

    encode: text -> special tokens cut out (longest first) -> the fragments to the vocabulary
            model's encoder (ENCODERS: engine/tokenizer/bpe.py, spm.py) -> ids (+ BOS/EOS)
    decode: ids -> each token's raw bytes -> UTF-8 text (invalid bytes become U+FFFD)
"""
from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Iterable, Mapping
from enum import IntEnum

import regex

from .bpe import BpeEncoder
from .decode import IncrementalDecoder
from .encoder import Encoder, VocabTables
from .gemma4 import Gemma4Encoder
from .metadata import K as _K
from .metadata import flag, num_list, str_list
from .pretokenizers import split_words
from .spm import SpmEncoder
from .wpm import WpmEncoder

log = logging.getLogger("engine.tokenizer")

# tokenizer.ggml.model -> its encoder class
ENCODERS: dict[str, type[Encoder]] = {cls.model: cls for cls in (BpeEncoder, SpmEncoder,
                                                                  Gemma4Encoder, WpmEncoder)}


class TokenType(IntEnum):
    """Values of `tokenizer.ggml.token_type` (llama.cpp's llama_token_type)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# -- end-of-generation detection by token text (llama.cpp llama_vocab::impl::load) ----------------
_EOT_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"})
_EOM_TEXTS = frozenset({"<|eom_id|>"})
_FIM_PAD_TEXTS = frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"})
_FIM_REP_TEXTS = frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"})
_FIM_SEP_TEXTS = frozenset({"<|file_sep|>"})
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["})

_SPECIAL_ID_KEYS = {  # metadata key suffix -> role
    "bos_token_id": "bos", "eos_token_id": "eos", "eot_token_id": "eot", "eom_token_id": "eom",
    "unknown_token_id": "unk", "seperator_token_id": "sep", "padding_token_id": "pad",
    "fim_pre_token_id": "fim_pre", "fim_suf_token_id": "fim_suf", "fim_mid_token_id": "fim_mid",
    "fim_pad_token_id": "fim_pad", "fim_rep_token_id": "fim_rep", "fim_sep_token_id": "fim_sep",
    "prefix_token_id": "fim_pre", "suffix_token_id": "fim_suf", "middle_token_id": "fim_mid",
}


def vocabulary_model(meta: Mapping[str, object]) -> str:
    """`tokenizer.ggml.model` if this module implements it; a ValueError saying why not."""
    model = meta.get(_K + "model")
    if not isinstance(model, str):
        raise ValueError(f"missing or invalid {_K}model")
    if model not in ENCODERS:
        supported = ", ".join(f"{m!r} ({cls.label})" for m, cls in sorted(ENCODERS.items()))
        raise ValueError(f"unsupported tokenizer model {model!r} ({_K}model); "
                         f"supported: {supported}")
    return model


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Immutable after construction; thread-safe."""

    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    unk_id: int | None
    pad_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    sep_id: int | None
    add_sep: bool                # the separator between a rerank pair's parts (llama.cpp)
    add_space_prefix: bool
    model: str                   # tokenizer.ggml.model, a key of ENCODERS
    pre: str | None              # tokenizer.ggml.pre as the file gives it
    pre_tokenizer: str | None    # the pre-tokenizer used for it (gpt2 only), e.g. "starcoder"

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: Mapping[str, object]) -> Tokenizer:
        """Build from GGUF metadata (key -> python value). Raises ValueError on bad metadata."""
        return cls(meta, vocabulary_model(meta))

    def __init__(self, meta: Mapping[str, object], model: str) -> None:
        texts = str_list(meta, _K + "tokens", required=True)
        assert texts is not None
        n = len(texts)
        if n == 0:
            raise ValueError(f"{_K}tokens is empty")
        types = num_list(meta, _K + "token_type", n, int) or [TokenType.NORMAL] * n
        scores: list[float] = num_list(meta, _K + "scores", n, float) or [0.0] * n
        types = types[:n]
        if types and (min(types) < 0 or max(types) > 6):
            types = [t if 0 <= t <= 6 else TokenType.UNDEFINED for t in types]
        self._types: list[int] = list(types)
        self._texts: list[str] = texts
        if "" in texts:
            for i, t in enumerate(texts):
                if not t:
                    texts[i] = f"[EMPTY_{i}]"  # llama.cpp renames empty tokens the same way
        self._id_of: dict[str, int] = dict(zip(texts, range(n)))
        if len(self._id_of) != n:  # a duplicate: name the first one
            first: dict[str, int] = {}
            for i, t in enumerate(texts):
                if first.setdefault(t, i) != i:
                    raise ValueError(f"duplicate token {t!r} in {_K}tokens (ids {first[t]}, {i})")
        self.n_vocab = n
        self.model = model

        # the vocabulary model's defaults, then the file's ids and flags (llama.cpp's order)
        encoder_type = ENCODERS[model]
        ids: dict[str, int | None] = dict.fromkeys(set(_SPECIAL_ID_KEYS.values()))
        ids.update(encoder_type.default_ids)
        pre_value = meta.get(_K + "pre")
        self.pre = pre_value if isinstance(pre_value, str) else None
        for suffix, role in _SPECIAL_ID_KEYS.items():
            v = meta.get(_K + suffix)
            if v is None or isinstance(v, bool):
                continue
            try:
                v = operator.index(v)  # type: ignore[arg-type]
            except TypeError:
                raise ValueError(f"{_K}{suffix} must be an integer, not {v!r}") from None
            if not 0 <= v < n:
                log.warning("tokenizer: ignoring %s%s = %d (vocabulary has %d tokens)",
                            _K, suffix, v, n)
                continue
            ids[role] = v
        for role, v in list(ids.items()):
            if v is not None and not 0 <= v < n:
                ids[role] = None  # a default id outside a tiny vocabulary
        self._detect_by_text(ids)
        self.bos_id, self.eos_id, self.unk_id = ids["bos"], ids["eos"], ids["unk"]
        self.eot_id, self.eom_id, self.pad_id = ids["eot"], ids["eom"], ids["pad"]
        self.eog_ids = self._end_of_generation(ids)
        self.sep_id = ids["sep"]
        self._encoder: Encoder = encoder_type.from_metadata(
            meta, VocabTables(texts, scores, self._id_of), self.unk_id)
        self.pre_tokenizer = self._encoder.pre_tokenizer
        self.add_space_prefix = self._encoder.add_space_prefix
        self.add_bos = (flag(meta, _K + "add_bos_token", self._encoder.default_add_bos)
                        or self._encoder.forces_add_bos)
        self.add_eos = flag(meta, _K + "add_eos_token", False)
        self.add_sep = flag(meta, _K + "add_sep_token", self._encoder.default_add_sep)
        self._ends_with_sep = self._encoder.ends_with_sep and self.sep_id is not None
        for add, role in (("add_bos", "bos"), ("add_eos", "eos")):
            if getattr(self, add) and ids[role] is None:
                if meta.get(f"{_K}{add}_token") is not None:
                    raise ValueError(f"{_K}{add}_token is true but there is no "
                                     f"{role.upper()} token id")
                setattr(self, add, False)  # only a vocabulary-type default: drop it

        # special tokens cut out of text before tokenizing: longest text first
        is_special = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN).__contains__
        special = list(itertools.compress(range(n), map(is_special, self._types)))
        special.sort(key=lambda i: (-len(self._texts[i]), i))
        self._special_all = [(self._texts[i], i) for i in special]
        self._special_user = [(self._texts[i], i) for i in special
                              if self._types[i] == TokenType.USER_DEFINED]
        self._pieces: list[bytes | None] = [None] * n

    def _detect_by_text(self, ids: dict[str, int | None]) -> None:
        """Find EOT/EOM/FIM tokens the file does not name, by their text; such tokens are treated
        as control tokens even when the file says otherwise (llama.cpp does the same)."""
        for role, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), ("fim_pad", _FIM_PAD_TEXTS),
                            ("fim_rep", _FIM_REP_TEXTS), ("fim_sep", _FIM_SEP_TEXTS)):
            if ids[role] is not None:
                continue
            found = [self._id_of[t] for t in texts if t in self._id_of]
            if found:
                tid = ids[role] = min(found)
                self._types[tid] = TokenType.CONTROL

    def _end_of_generation(self, ids: dict[str, int | None]) -> frozenset[int]:
        eog = {ids[r] for r in ("fim_pad", "fim_rep", "fim_sep", "eos", "eot", "eom")}
        # Harmony (gpt-oss) ends a message with <|end|> and goes on: only <|return|> and
        # <|call|> end its generation (llama.cpp drops <|end|> from the set the same way)
        harmony = "<|return|>" in self._id_of and "<|call|>" in self._id_of
        for t in _EOG_TEXTS:
            i = self._id_of.get(t)
            if i is not None:
                self._types[i] = TokenType.CONTROL
                if not (harmony and t == "<|end|>"):
                    eog.add(i)
        return frozenset(i for i in eog if i is not None)

    # -- queries --------------------------------------------------------------------------------
    def token_text(self, id: int) -> str:
        """The token as stored in the vocabulary (byte symbols / ▁ not decoded)."""
        return self._texts[self._index(id)]

    def token_type(self, id: int) -> TokenType:
        return TokenType(self._types[self._index(id)])

    def token_id(self, text: str) -> int | None:
        """Id of the token whose stored text is exactly `text`, if any."""
        return self._id_of.get(text)

    def is_special(self, id: int) -> bool:
        """Control and unknown tokens: the ones `decode(..., skip_special=True)` drops."""
        return self._types[self._index(id)] in (TokenType.CONTROL, TokenType.UNKNOWN)

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eog_ids)})")

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False,
               parse_special: bool = False) -> list[int]:
        """Token ids for `text`.

        add_special: prepend BOS / append EOS where the file's add_bos_token / add_eos_token
        say so.
        parse_special: control-token text such as "<|im_start|>" becomes that token's id;
        otherwise it is tokenized as ordinary text.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates; llama.cpp reads such bytes as U+FFFD
            text = regex.sub(r"[\ud800-\udfff]", "\ufffd", text)
        out: list[int] = []
        if add_special and self.add_bos:
            assert self.bos_id is not None
            out.append(self.bos_id)
        out += self._encoder.encode_fragments(self._partition(text, parse_special))
        if add_special and self._ends_with_sep:  # WPM: [SEP], whatever add_eos says
            assert self.sep_id is not None
            out.append(self.sep_id)
        elif add_special and self.add_eos:
            assert self.eos_id is not None
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of `text`: one token at a time, longest first, every
        non-overlapping occurrence left to right; what remains stays text."""
        fragments: list[str | int] = [text] if text else []
        for tok, tid in (self._special_all if parse_special else self._special_user):
            if tok not in text:
                continue
            cut: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or tok not in frag:
                    cut.append(frag)
                    continue
                for k, part in enumerate(frag.split(tok)):
                    if k:
                        cut.append(tid)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments

    def pre_tokenize(self, text: str) -> list[str]:
        """The words the BPE pre-tokenizer splits `text` into (before byte mapping)."""
        if not isinstance(self._encoder, BpeEncoder):
            raise ValueError("pre_tokenize applies to byte-level BPE (gpt2) vocabularies only")
        return split_words(text, self._encoder.patterns)

    # -- decoding -------------------------------------------------------------------------------
    def _index(self, id: int) -> int:
        """`id` as a plain int (numpy integers welcome), checked against the vocabulary."""
        try:
            i = operator.index(id)
        except TypeError:
            raise TypeError(f"token id must be an integer, not {type(id).__name__}") from None
        if not 0 <= i < self.n_vocab:
            raise ValueError(f"token id {i} is outside the vocabulary (0..{self.n_vocab - 1})")
        return i

    def token_bytes(self, id: int) -> bytes:
        """Raw bytes of one token. Control, unknown and user-defined tokens give their text;
        unused and undefined tokens give nothing (as in llama.cpp)."""
        id = self._index(id)
        piece = self._pieces[id]
        if piece is None:
            piece = self._pieces[id] = self._render(id)
        return piece

    def _render(self, id: int) -> bytes:
        text, kind = self._texts[id], self._types[id]
        if kind in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED):
            return text.encode("utf-8")
        if kind == TokenType.NORMAL:
            return self._encoder.normal_bytes(text)
        if kind == TokenType.BYTE:
            m = regex.fullmatch(r"<0x([0-9A-Fa-f]{2})>", text)
            return bytes([int(m.group(1), 16)]) if m else text.encode("utf-8")
        return b""

    def piece(self, id: int, skip_special: bool) -> bytes:
        """token_bytes(id), or nothing for a control or unknown token with skip_special."""
        id = self._index(id)
        if skip_special and self._types[id] in (TokenType.CONTROL, TokenType.UNKNOWN):
            return b""
        return self.token_bytes(id)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD. skip_special drops control and unknown
        tokens. For SentencePiece vocabularies with add_space_prefix, the space encode() put in
        front is removed again (llama.cpp's llama_detokenize rules)."""
        ids = list(ids)
        strip_space = self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            strip_space = False
            ids = ids[1:]
        if skip_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        chunks = []
        for id in ids:
            piece = self.piece(id, skip_special)
            if strip_space and piece[:1] == b" ":
                piece = piece[1:]
            strip_space = False
            chunks.append(piece)
        return b"".join(chunks).decode("utf-8", errors="replace")

    def incremental_decoder(self, skip_special: bool = False) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special)
