"""Constrained decoding with llguidance: which tokens a grammar allows next, for a whole batch.

A `Constraint` is one sequence's grammar state (an `llguidance.LLMatcher`). Each step the
`MaskFiller` computes the allowed-token bitmasks of every constrained sequence of the batch in
one call into llguidance's parallel executor (Rust threads, the GIL released), the sampler sets
every other token to -inf before anything else touches the logits, and the sampled token then
advances the matcher. Unconstrained sequences never enter this module.

    Constraint:  ready --consume(token)--> ready ... --grammar complete--> done (the sequence
                   |                                  (no byte can follow)   stops: "stop")
                   +--a token the grammar refused (cannot happen: the mask forbids it)--> error

Grammars are compiled against a `TokenizerAdapter`: the model's token bytes, its special tokens
(marked so that grammar text never matches them; `<[id]>` or `<|name|>` in Lark refers to them)
and its end-of-generation ids. Building one walks the whole vocabulary (~0.2 s for SmolLM2's 49k
tokens, ~1.2 s for Gemma 3's 262k on a quiet machine), so it is built once per tokenizer and
cached.

Measured on SmolLM2 (49k vocabulary), a JSON-schema mask costs 20-150 us per sequence; compiling
a schema ~1 ms, plus a few ms for the first mask, which `compile` computes too, so none of it
lands in a decode step.
"""
from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import llguidance as llg
import numpy as np

from .loaded import ModelTokenizer


def _limits() -> llg.LLParserLimits:
    """Grammar limits: a request's schema must not make a step slow for everyone else."""
    return llg.LLParserLimits(step_max_items=50_000, max_grammar_size=500_000, verbose_errors=False)


class ConstraintError(ValueError):
    """A grammar or schema that llguidance cannot compile; the message says why (and where)."""


class _VocabularyView:
    """What llguidance's TokenizerWrapper protocol asks of a tokenizer, from ours."""

    is_tokenizer_wrapper = True

    def __init__(self, tokenizer: ModelTokenizer) -> None:
        n = tokenizer.n_vocab
        self.tokens = [tokenizer.token_bytes(i) for i in range(n)]
        self.special_token_ids = [i for i in range(n) if tokenizer.is_special(i)]
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self._encode = tokenizer.encode

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._encode(text))


class TokenizerAdapter:
    """One model vocabulary as llguidance sees it; build with `TokenizerAdapter.of(tokenizer)`."""

    def __init__(self, tokenizer: ModelTokenizer) -> None:
        self.n_vocab: int = tokenizer.n_vocab
        self.eog_ids = sorted(tokenizer.eog_ids)
        # llguidance duck-types its TokenizerWrapper but its stubs name the class
        view = cast(llg.TokenizerWrapper, _VocabularyView(tokenizer))
        self.lltokenizer = llg.LLTokenizer(view,
                                           eos_token=self.eog_ids or None)
        self.mask_words = (self.n_vocab + 31) // 32  # int32 words per bitmask row

    _cache: ClassVar[weakref.WeakKeyDictionary[ModelTokenizer, TokenizerAdapter]] = (
        weakref.WeakKeyDictionary())
    _lock = threading.Lock()

    @classmethod
    def of(cls, tokenizer: ModelTokenizer) -> TokenizerAdapter:
        """The adapter of `tokenizer`, built on first use (seconds for big vocabularies: call
        it off the event loop) and kept as long as the tokenizer lives."""
        with cls._lock:
            adapter = cls._cache.get(tokenizer)
            if adapter is None:
                adapter = cls._cache[tokenizer] = cls(tokenizer)
            return adapter

    def compile(self, grammar: str) -> Constraint:
        """A fresh constraint for `grammar` (a string from `llguidance.grammar_from`), with its
        first mask computed. Raises ConstraintError. Drops the GIL while it works."""
        matcher = llg.LLMatcher(self.lltokenizer, grammar, log_level=0,
                                limits=_limits())
        if matcher.is_error():
            raise ConstraintError(_first_line(matcher.get_error()))
        constraint = Constraint(matcher, self)
        constraint.allowed()  # the first mask builds the lexer: pay it here, not in a step
        if matcher.is_error():
            raise ConstraintError(_first_line(matcher.get_error()))
        return constraint


def _first_line(message: str) -> str:
    """llguidance's message on one line (regex errors come with a caret drawing)."""
    return " ".join(message.split()) or "invalid grammar"


class Constraint:
    """One sequence's grammar state. Single-threaded like the sequence that owns it."""

    def __init__(self, matcher: llg.LLMatcher, adapter: TokenizerAdapter) -> None:
        self.matcher = matcher
        self.adapter = adapter

    def copy(self) -> Constraint:
        """An independent copy in the same state (the n choices of one request)."""
        return Constraint(self.matcher.deep_copy(), self.adapter)

    def consume(self, token: int) -> bool:
        """Advance by the sampled token; False if the grammar refused it (now in error)."""
        return bool(self.matcher.consume_token(token))

    @property
    def done(self) -> bool:
        """Nothing but end-of-generation may follow (the grammar is complete), or an error."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    @property
    def error(self) -> str:
        return str(self.matcher.get_error())

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar allows next, for one sequence on this thread
        (a batch uses MaskFiller)."""
        words = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(words, bitorder="little")[:self.adapter.n_vocab].view(bool)


class MaskFiller:
    """Computes the masks of a step's constrained sequences together, into one reused buffer."""

    def __init__(self, threads: int | None = None) -> None:
        self._executor = llg.LLExecutor(threads)
        self._words = np.zeros((0, 0), dtype=np.int32)  # int32 [rows, mask_words]

    def fill(self, constraints: Sequence[Constraint]) -> list[np.ndarray]:
        """bool [n_vocab] per constraint, in order (views into scratch: use before next fill)."""
        if not constraints:
            return []
        adapter = constraints[0].adapter
        if any(c.adapter is not adapter for c in constraints):
            raise ValueError("constraints of one batch must share a tokenizer")
        rows, words = len(constraints), adapter.mask_words
        if self._words.shape[0] < rows or self._words.shape[1] != words:
            self._words = np.zeros((max(rows, 8), words), dtype=np.int32)
        buf = self._words
        self._executor.unsafe_compute_mask_ptr(
            [(c.matcher, i) for i, c in enumerate(constraints)], buf.ctypes.data,
            words * 4, buf.shape[0])
        bits = np.unpackbits(buf[:rows].view(np.uint8), axis=1, bitorder="little")
        return [bits[i, :adapter.n_vocab].view(bool) for i in range(rows)]


# --------------------------------------------------------------------------------- grammar texts

def json_schema_grammar(schema: dict[str, Any] | bool) -> str:
    """llguidance grammar for JSON valid against `schema` (compact or spaced, as models write)."""
    # fixed separators: free whitespace lets a small model pad with newlines until max_tokens
    return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_STYLE)


JSON_STYLE: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def lark_grammar(text: str) -> str:
    return llg.LLMatcher.grammar_from_lark(text)


def with_subgrammars(grammar: str, named: dict[str, str]) -> str:
    """One grammar from a Lark `grammar` that refers to others by name (`@name` in its rules)
    and their Lark texts: each keeps its own lexer and %-options (a freeform tool's input)."""
    if not named:
        return grammar
    return json.dumps({"grammars": [{"lark_grammar": grammar}] + [
        {"name": name, "lark_grammar": text} for name, text in named.items()]})


def after_block(grammar: str, close: str) -> str:
    """`grammar` after the rest of a block the prompt opened: free text up to the block's
    closing tag (`close`: its text, or `<[id]>` when it is a control token), a little
    whitespace, then `grammar` (Lark text or a top-level grammar) from its start."""
    top = json.loads(grammar) if grammar.lstrip().startswith("{") else {
        "grammars": [{"lark_grammar": grammar}]}
    body, *others = top["grammars"]
    if close.startswith("<["):  # text can never contain a control token: free text, then it
        rest = f"start: REST? {close} WS @after_block\nREST: /(?s:.+)/\n"
    else:  # the first closing tag ends the free text (a lazy lexeme)
        rest = (f"start: rest WS @after_block\n"
                f"rest[lazy]: /(?s:.*){_regex_literal(close)}/\n")
    rest += "WS: /[ \\t\\r\\n]{0,4}/\n"
    return json.dumps({"grammars": [{"lark_grammar": rest}, {**body, "name": "after_block"},
                                    *others]})


def _regex_literal(text: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" if not c.isalnum() else c for c in text)


def gbnf_grammar(text: str) -> str:
    """llama.cpp's GBNF (or Lark) text; raises ConstraintError when it does not convert."""
    try:
        return llg.grammar_from("gbnf", text)
    except ValueError as exc:
        raise ConstraintError(str(exc).splitlines()[0]) from None


def check_grammar(grammar: str) -> str | None:
    """The error llguidance reports for `grammar` without a tokenizer, or None if it compiles."""
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(
        grammar, None, limits=_limits())
    return _first_line(messages[0]) if is_error and messages else None
