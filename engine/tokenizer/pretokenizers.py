"""Pre-tokenizers of byte-level BPE vocabularies (llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe).

`tokenizer.ggml.pre` names one; its regexes apply one after another, each splitting the pieces of
the previous one into matches and the gaps between them, so the words always join back to the
text. Each word is then merged on its own (engine/tokenizer/bpe.py).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import regex

log = logging.getLogger("engine.tokenizer")

_K = "tokenizer.ggml."

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


def choose_pre_tokenizer(value: object) -> PreTokenizer:
    """The pre-tokenizer for a `tokenizer.ggml.pre` value: llama.cpp's grouping, else 'default'
    with a warning (a missing or unknown value still tokenizes, perhaps not as trained)."""
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


def compiled_patterns(pre: PreTokenizer) -> tuple[regex.Pattern[str], ...]:
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
