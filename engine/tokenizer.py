"""Tokenizers built from GGUF `tokenizer.ggml.*` metadata, behaving like llama.cpp's.

Two vocabulary models are supported (`tokenizer.ggml.model`):

  gpt2   byte-level BPE. Text -> pre-tokenizer regexes (chosen by `tokenizer.ggml.pre`, applied
         one after another, each splitting the pieces of the previous one) -> each piece's UTF-8
         bytes mapped to printable characters -> merges applied lowest rank first.
  llama  SentencePiece as llama.cpp runs it (SPM): spaces become U+2581, a space is prefixed to
         the text, adjacent symbols merge highest-score first, and characters no token covers
         fall back to <0xXX> byte tokens.

Before either runs, special tokens are cut out of the text (llama.cpp's tokenizer_st_partition):
longest token text first, every occurrence. Control and unknown tokens are cut out only with
`parse_special=True`; user-defined tokens always are, as in llama.cpp and Hugging Face.

Merging is O(n log n) for any text (engine/tokenizer_merge.py); long words (BPE) and long texts
(SentencePiece) merge in the compiled twin of that loop (engine/kernels/merge.py).

Decoding is the byte-exact inverse: token_bytes() gives each token's raw bytes; invalid UTF-8
is replaced only when bytes become text. IncrementalDecoder streams that text token by token.
"""
from __future__ import annotations

import codecs
import itertools
import logging
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import regex

from .tokenizer_merge import CompiledBpe, bpe_merge, spm_merge

log = logging.getLogger(__name__)

SPM_SPACE = "\u2581"  # SentencePiece's visible space, "▁"
_WORD_CACHE_MAX = 200_000  # pre-token words remembered per tokenizer (cleared when full)
_COMPILED_MERGE_MIN = 48   # words this long merge in the compiled loop (shorter: the call costs more)
_COMPILED_SPM_MIN = 256    # SentencePiece texts this long likewise


class TokenType(IntEnum):
    """Values of `tokenizer.ggml.token_type` (llama.cpp's llama_token_type)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# -- GPT-2 byte <-> character map -----------------------------------------------------------------
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


_BYTE_CHARS = _byte_chars()
_CHAR_BYTES = {c: b for b, c in enumerate(_BYTE_CHARS)}
_LATIN1_TO_BYTE_CHARS = str.maketrans({b: c for b, c in enumerate(_BYTE_CHARS)})


def _byte_encode(word: str) -> str:
    # UTF-8 bytes seen as Latin-1 characters, then translated in one C-level pass
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)


def _byte_decode(text: str) -> bytes:
    out = bytearray()
    for c in text:
        b = _CHAR_BYTES.get(c)
        if b is None:
            out += c.encode("utf-8")  # not a byte symbol: keep the character itself
        else:
            out.append(b)
    return bytes(out)


# -- pre-tokenizers (llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe) ----------------------------
# Written for the `regex` package. llama.cpp runs the GPT-2 and Llama-3 patterns with hand-written
# matchers that behave like the patterns below; contraction suffixes are case-sensitive in the
# GPT-2 family ("I'M" -> I ' M) and case-insensitive in the Llama-3 family.
_CONTRACTIONS_ANY_CASE = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (_CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SEED_CODER = (_CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
_BAILING = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
# "upper" = a letter that is not a-z, "lower" = a letter that is not A-Z (llama.cpp's adaptation)
_UP, _LO = r"(?:(?=\p{L})[^a-z])", r"(?:(?=\p{L})[^A-Z])"
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UP}*{_LO}+|[^\r\n\p{{L}}\p{{N}}]?{_UP}+{_LO}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UP}*{_LO}+{_CONTRACTIONS_ANY_CASE}?"
          rf"|[^\r\n\p{{L}}\p{{N}}]?{_UP}+{_LO}*{_CONTRACTIONS_ANY_CASE}?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreTokenizer:
    name: str
    patterns: tuple[str, ...]      # applied in order; each splits the pieces of the previous one
    ignore_merges: bool = False    # a piece that is already a token is not merged up from bytes
    add_bos: bool = False          # llama.cpp's default when the file has no add_bos_token


_PRE_TOKENIZERS: dict[str, PreTokenizer] = {p.name: p for p in (
    PreTokenizer("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    PreTokenizer("gpt2", (_GPT2,)),
    PreTokenizer("starcoder", (r"\p{N}", _GPT2)),  # every digit on its own
    PreTokenizer("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    PreTokenizer("llama3", (_LLAMA3,), ignore_merges=True, add_bos=True),
    PreTokenizer("dbrx", (_LLAMA3,)),
    PreTokenizer("chatglm4", (_LLAMA3,)),
    PreTokenizer("qwen2", (_QWEN2,)),
    PreTokenizer("qwen35", (_QWEN35,)),
    PreTokenizer("seed-coder", (_SEED_CODER,)),
    PreTokenizer("bailingmoe", (_BAILING,)),
    PreTokenizer("tekken", (_TEKKEN,), ignore_merges=True, add_bos=True),
    PreTokenizer("gpt-4o", (_GPT4O,)),
    PreTokenizer("deepseek-llm", (
        r"[\r\n]", r"\s?\p{LC}+",
        r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\Z", _CJK, r"\p{N}+")),
    PreTokenizer("deepseek-coder", (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    PreTokenizer("deepseek-v3", (
        r"\p{N}{1,3}", r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    PreTokenizer("poro", (_PORO,)),
    PreTokenizer("viking", (_PORO, r"\p{N}")),
)}

# `tokenizer.ggml.pre` value -> pre-tokenizer, as llama.cpp groups them
_PRE_ALIASES: dict[str, str] = {
    **dict.fromkeys(("default",), "default"),
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                     "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "exaone4", "jina-v1-en",
                     "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion",
                     "granite-docling"), "gpt2"),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                     "minerva-7b", "mellum2"), "starcoder"),
    **dict.fromkeys(("falcon",), "falcon"),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2"), "llama3"),
    **dict.fromkeys(("dbrx", "smaug-bpe"), "dbrx"),
    **dict.fromkeys(("glm4", "chatglm-bpe"), "chatglm4"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
                     "hunyuan", "solar-open", "grok-2"), "qwen2"),
    **dict.fromkeys(("qwen35",), "qwen35"),
    **dict.fromkeys(("seed-coder",), "seed-coder"),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), "bailingmoe"),
    **dict.fromkeys(("tekken",), "tekken"),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), "gpt-4o"),
    **dict.fromkeys(("deepseek-llm",), "deepseek-llm"),
    **dict.fromkeys(("deepseek-coder",), "deepseek-coder"),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm"), "deepseek-v3"),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), "poro"),
    **dict.fromkeys(("viking",), "viking"),
}

KNOWN_PRE_TOKENIZERS: frozenset[str] = frozenset(_PRE_ALIASES)
_COMPILED: dict[str, tuple[regex.Pattern[str], ...]] = {}


def _compiled(pre: PreTokenizer) -> tuple[regex.Pattern[str], ...]:
    if pre.name not in _COMPILED:
        _COMPILED[pre.name] = tuple(regex.compile(p) for p in pre.patterns)
    return _COMPILED[pre.name]


def split_words(text: str, patterns: Iterable[regex.Pattern[str]]) -> list[str]:
    """llama.cpp's unicode_regex_split: every pattern splits each piece into matches and the gaps
    between them (both kept), so the pieces always join back to `text`."""
    pieces = [text] if text else []
    for pat in patterns:
        out: list[str] = []
        for piece in pieces:
            pos = 0
            for m in pat.finditer(piece):
                start, end = m.span()
                if start == end:
                    continue
                if start > pos:
                    out.append(piece[pos:start])
                out.append(piece[start:end])
                pos = end
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces


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

_K = "tokenizer.ggml."
_SPECIAL_ID_KEYS = {  # metadata key suffix -> role
    "bos_token_id": "bos", "eos_token_id": "eos", "eot_token_id": "eot", "eom_token_id": "eom",
    "unknown_token_id": "unk", "seperator_token_id": "sep", "padding_token_id": "pad",
    "fim_pre_token_id": "fim_pre", "fim_suf_token_id": "fim_suf", "fim_mid_token_id": "fim_mid",
    "fim_pad_token_id": "fim_pad", "fim_rep_token_id": "fim_rep", "fim_sep_token_id": "fim_sep",
    "prefix_token_id": "fim_pre", "suffix_token_id": "fim_suf", "middle_token_id": "fim_mid",
}


# -- metadata access with clear errors ------------------------------------------------------------
def _str_list(meta: Mapping[str, object], key: str, required: bool) -> list[str] | None:
    v = meta.get(key)
    if v is None:
        if required:
            raise ValueError(f"missing {key}")
        return None
    if not isinstance(v, (list, tuple)) or not all(issubclass(t, str) for t in set(map(type, v))):
        raise ValueError(f"{key} must be a list of strings")
    return list(v)


def _num_list(meta: Mapping[str, object], key: str, n: int, kind: type) -> list[Any] | None:
    v = meta.get(key)
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or not all(  # per distinct type: ~100k items here
            issubclass(t, kind) or (kind is float and issubclass(t, int)) for t in set(map(type, v))):
        raise ValueError(f"{key} must be a list of {kind.__name__}")
    if len(v) < n:
        raise ValueError(f"{key} has {len(v)} entries for {n} tokens")
    return list(v)


def _flag(meta: Mapping[str, object], key: str, default: bool) -> bool:
    v = meta.get(key)
    if v is None:
        return default
    if not isinstance(v, (bool, int)):
        raise ValueError(f"{key} must be a boolean")
    return bool(v)


def vocabulary_model(meta: Mapping[str, object]) -> str:
    """`tokenizer.ggml.model` if this module implements it; a ValueError saying why not."""
    model = meta.get(_K + "model")
    if not isinstance(model, str):
        raise ValueError(f"missing or invalid {_K}model")
    if model not in ("gpt2", "llama"):
        raise ValueError(f"unsupported tokenizer model {model!r} ({_K}model); "
                         "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece)")
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
    add_space_prefix: bool
    model: str                   # "gpt2" or "llama"
    pre: str | None              # tokenizer.ggml.pre as the file gives it
    pre_tokenizer: str | None    # the pre-tokenizer used for it (gpt2 only), e.g. "starcoder"

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: Mapping[str, object]) -> "Tokenizer":
        """Build from GGUF metadata (key -> python value). Raises ValueError on bad metadata."""
        return cls(meta, vocabulary_model(meta))

    def __init__(self, meta: Mapping[str, object], model: str) -> None:
        texts = _str_list(meta, _K + "tokens", required=True)
        assert texts is not None
        n = len(texts)
        if n == 0:
            raise ValueError(f"{_K}tokens is empty")
        types = _num_list(meta, _K + "token_type", n, int) or [TokenType.NORMAL] * n
        self._scores: list[float] = _num_list(meta, _K + "scores", n, float) or [0.0] * n
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

        # vocabulary-type defaults, then the file's flags (llama.cpp's order)
        ids: dict[str, int | None] = dict.fromkeys(set(_SPECIAL_ID_KEYS.values()))
        pre_value = meta.get(_K + "pre")
        self.pre = pre_value if isinstance(pre_value, str) else None
        if model == "llama":
            self.pre_tokenizer = None
            self._spm_vocab = None  # built when a long text first needs the compiled merge
            ids.update(bos=1, eos=2, unk=0)
            add_bos, self.add_space_prefix = True, True
            self._byte_ids = [self._id_of.get(f"<0x{b:02X}>",
                                              self._id_of.get(chr(b)) if b < 0x80 else None)
                              for b in range(256)]
        else:
            pre = self._choose_pre(pre_value)
            self.pre_tokenizer = pre.name
            self._pre = pre
            self._patterns = _compiled(pre)
            self._merges = _str_list(meta, _K + "merges", required=True)  # ranked when first used
            self._ranks_built: dict[tuple[str, str], int] | None = None
            self._word_cache: dict[str, tuple[int, ...]] = {}
            self._compiled_bpe: CompiledBpe | None = None
            add_bos, self.add_space_prefix = pre.add_bos, False
        self.add_bos = _flag(meta, _K + "add_bos_token", add_bos)
        self.add_eos = _flag(meta, _K + "add_eos_token", False)
        if model == "llama":
            self.add_space_prefix = _flag(meta, _K + "add_space_prefix", True)

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
        for flag, role in (("add_bos", "bos"), ("add_eos", "eos")):
            if getattr(self, flag) and ids[role] is None:
                if meta.get(f"{_K}{flag}_token") is not None:
                    raise ValueError(f"{_K}{flag}_token is true but there is no "
                                     f"{role.upper()} token id")
                setattr(self, flag, False)  # only a vocabulary-type default: drop it

        # special tokens cut out of text before tokenizing: longest text first
        is_special = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN).__contains__
        special = list(itertools.compress(range(n), map(is_special, self._types)))
        special.sort(key=lambda i: (-len(self._texts[i]), i))
        self._special_all = [(self._texts[i], i) for i in special]
        self._special_user = [(self._texts[i], i) for i in special
                              if self._types[i] == TokenType.USER_DEFINED]
        self._pieces: list[bytes | None] = [None] * n

    @staticmethod
    def _choose_pre(value: object) -> PreTokenizer:
        if value is None or value == "":
            log.warning("tokenizer: %spre is missing; using the 'default' pre-tokenizer "
                        "(tokenization may differ from the model's training)", _K)
            return _PRE_TOKENIZERS["default"]
        if not isinstance(value, str):
            raise ValueError(f"{_K}pre must be a string")
        name = _PRE_ALIASES.get(value)
        if name is None:
            log.warning("tokenizer: unknown pre-tokenizer %r in %spre; falling back to 'default' "
                        "(tokenization may differ from the model's training)", value, _K)
            name = "default"
        return _PRE_TOKENIZERS[name]

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
        for t in _EOG_TEXTS:
            i = self._id_of.get(t)
            if i is not None:
                eog.add(i)
                self._types[i] = TokenType.CONTROL
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
        fragments = self._partition(text, parse_special)
        if self.model == "llama":
            after_special = True  # the text start counts as "after a special token"
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    after_special = True
                    continue
                if self.add_space_prefix and after_special:
                    frag = " " + frag
                out += self._spm(frag.replace(" ", SPM_SPACE))
                after_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out += self._bpe(frag)
        if add_special and self.add_eos:
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
        if self.model != "gpt2":
            raise ValueError("pre_tokenize applies to byte-level BPE (gpt2) vocabularies only")
        return split_words(text, self._patterns)

    def _bpe(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._word_cache
        for word in split_words(text, self._patterns):
            ids = cache.get(word)
            if ids is None:
                if len(word) >= _COMPILED_MERGE_MIN and not (
                        self._pre.ignore_merges and _byte_encode(word) in self._id_of):
                    ids = self._bpe_long_word(word)
                else:
                    ids = self._bpe_word(_byte_encode(word))
                if len(cache) >= _WORD_CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out += ids
        return out

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        """Merge one byte-encoded word: always the lowest-ranked adjacent pair, leftmost first
        (the order llama.cpp's priority queue pops them in)."""
        if self._pre.ignore_merges and word in self._id_of:
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

    def _bpe_long_word(self, word: str) -> tuple[int, ...]:
        """_bpe_word in the compiled merge loop (a Python merge costs ~2 us)."""
        merger = self._compiled_bpe
        if merger is None:
            merger = self._compiled_bpe = CompiledBpe(self._ranks, self._id_of, self.n_vocab,
                                                      _BYTE_CHARS)
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

    def _spm(self, text: str) -> list[int]:
        """llama.cpp's SPM: start from single characters; repeatedly merge the adjacent pair whose
        concatenation is a token with the highest score (leftmost on ties); characters left
        without a token become <0xXX> byte tokens."""
        id_of = self._id_of
        if len(text) >= _COMPILED_SPM_MIN:
            pieces = self._spm_compiled(text)
        else:
            pieces = [(id_of.get(p), p) for p in spm_merge(text, id_of, self._scores)[0]]
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

    def _spm_compiled(self, text: str) -> list[tuple[int | None, str]]:
        """spm_merge in the compiled loop: (token id, or None and the lone character)."""
        from .kernels.merge_spm import SpmVocab, spm_merge as compiled_spm_merge

        vocab = self._spm_vocab
        if vocab is None:  # ~0.3 s for 262k tokens, paid by the first long text, not the load
            vocab = self._spm_vocab = SpmVocab(self._texts, self._scores)
        symbols, _ = compiled_spm_merge(text, vocab)
        return [(tid, "") if tid >= 0 else (None, text[start]) for tid, start in symbols]

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
            if self.model == "llama":
                return text.replace(SPM_SPACE, " ").encode("utf-8")
            return _byte_decode(text)
        if kind == TokenType.BYTE:
            m = regex.fullmatch(r"<0x([0-9A-Fa-f]{2})>", text)
            return bytes([int(m.group(1), 16)]) if m else text.encode("utf-8")
        return b""

    def _piece(self, id: int, skip_special: bool) -> bytes:
        id = self._index(id)
        if skip_special and self._types[id] in (TokenType.CONTROL, TokenType.UNKNOWN):
            return b""
        return self.token_bytes(id)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD. skip_special drops control and unknown
        tokens. For SentencePiece vocabularies with add_space_prefix, the space encode() put in
        front is removed again (llama.cpp's llama_detokenize rules)."""
        ids = list(ids)
        strip_space = self.model == "llama" and self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            strip_space = False
            ids = ids[1:]
        if skip_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        chunks = []
        for id in ids:
            piece = self._piece(id, skip_special)
            if strip_space and piece[:1] == b" ":
                piece = piece[1:]
            strip_space = False
            chunks.append(piece)
        return b"".join(chunks).decode("utf-8", errors="replace")

    def incremental_decoder(self, skip_special: bool = False) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special)


class IncrementalDecoder:
    """Streams generated text: feed token ids one by one, get back only complete characters.

        push(id) -> bytes of the token -> [UTF-8 decoder] -> the characters now complete
                                           holds back 0..3 bytes of an unfinished character
        flush()  -> the held-back bytes as U+FFFD (if any); the decoder is empty again

    The concatenation of all returned strings equals decode() of the same ids, except that no
    SentencePiece prefix space is removed: the ids continue a prompt, so their spaces are real.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        return self._utf8.decode(self._tokenizer._piece(id, self._skip_special))

    def flush(self) -> str:
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    @property
    def pending(self) -> bool:
        """True while an unfinished multi-byte character is held back."""
        return bool(self._utf8.getstate()[0])
