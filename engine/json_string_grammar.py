"""A Lark grammar's language written inside a JSON string: the grammar of the escaped text.

A freeform (custom) tool that the model may call among others is called in its family's JSON
(`{"name": "apply_patch", "arguments": {"input": "..."}}`), so its input is the body of a JSON
string. `json_string_lark(text)` turns the tool's Lark grammar G into one whose sentences are
exactly the JSON escapes of G's sentences (`"` -> `\\"`, `\\` -> `\\\\`, newline -> `\\n`, the other
controls below 0x20 -> their short or `\\u00XX` escape, everything else as itself, as
`json.dumps(..., ensure_ascii=False)` writes it), so decoding the string gives text G parses.

Every lexeme of the result is one character of the JSON text (a character that needs no escape,
or one whole escape): escaping gives terminals common prefixes (`\\` begins both `\\"` and `\\n`),
and llguidance's lexer, which never backtracks, would take a longer match where a shorter one
was meant. So each terminal becomes a rule over such one-character lexemes, and the grammar's
Earley parser carries what the lexer cannot:

    "literal"       a sequence of its characters' JSON text ("literal"i: the letters fold)
    "a".."z"        one character of the range
    /regex/flags    parsed (Python's re parser: Lark's own regex dialect) into the same
                    sequences, choices and repeats, each single-character item X becoming one
                    lexeme /[X--[controls"\\]]|the escapes of the controls, " and \\ X matches/
    NAME: ...       the rule esc_name (references follow)
    %import common.NAME   the common terminals, defined here (then as above)

What cannot be written inside a JSON string is a ValueError saying what: special tokens,
nested %json / %regex / @grammar references, %ignore (it would need a terminal), anchors,
look-around and back-references.
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from re import _constants as C  # type: ignore[attr-defined]  # Python's regex parser:
from re import _parser as sre  # type: ignore[attr-defined]  # Lark's regex dialect
from typing import Any

# the characters JSON must escape, and how json.dumps writes them
SPECIAL = [chr(i) for i in range(0x20)] + ['"', "\\"]
ESCAPE = {c: json.dumps(c)[1:-1] for c in SPECIAL}
NOT_SPECIAL = r"--[\x{0}-\x{1f}\x{22}\x{5c}]"

# Lark's common terminals a grammar may import (their usual meanings, as regexes)
COMMON = {
    "LF": r"/\n/", "CR": r"/\r/", "NEWLINE": r"/(\r?\n)+/", "WS": r"/[ \t\f\r\n]+/",
    "WS_INLINE": r"/[ \t]+/", "DIGIT": r"/[0-9]/", "HEXDIGIT": r"/[0-9a-fA-F]/",
    "INT": r"/[0-9]+/", "SIGNED_INT": r"/[+-]?[0-9]+/", "LCASE_LETTER": r"/[a-z]/",
    "UCASE_LETTER": r"/[A-Z]/", "LETTER": r"/[a-zA-Z]/", "WORD": r"/[a-zA-Z]+/",
    "CNAME": r"/[_a-zA-Z][_a-zA-Z0-9]*/", "ESCAPED_STRING": r'/"(?:[^"\\\n]|\\.)*"/',
}

_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<range>\.\.)
  | (?P<import>%import[ \t]+common(?:\.[A-Z_][A-Z0-9_]*|[ \t]*\([^)]*\))[ \t]*(?:->[ \t]*\w+)?)
  | (?P<refused>%json|%regex|%ignore|%declare|%override|%extend|@[\w-]+|<\[|<\|)
""", re.VERBOSE)
_DEFINITION = re.compile(r"^([ \t]*)(_?[A-Z][A-Z0-9_]*)(?:\.-?\d+)?([ \t]*:)", re.MULTILINE)
_NAME = re.compile(r"\b_?[A-Z][A-Z0-9_]*\b")
_RANGE = "\x00range:"  # a one-character literal waiting for its '..' and upper end


def json_string_lark(text: str) -> str:
    """Lark text whose sentences are the JSON string bodies of `text`'s (see the docstring).
    Raises ValueError naming what cannot be escaped."""
    pieces: list[tuple[bool, str]] = []  # (plain grammar text, its text)
    imports: list[str] = []
    at = 0
    low: str | None = None  # a range's lower end, once its '..' is read
    for m in _TOKEN.finditer(text):
        pieces.append((True, text[at:m.start()]))
        at = m.end()
        kind, token = m.lastgroup, m.group()
        if kind == "comment":
            continue
        if kind == "refused":
            raise ValueError(f"'{token}' cannot be written inside a JSON string")
        if kind == "import":
            imports += _imported(token)
            continue
        if kind == "range":  # "a".."z", or a repeat's bounds (x~1..3: plain text)
            if len(pieces) >= 2 and pieces[-2][1].startswith(_RANGE) \
                    and not pieces[-1][1].strip():
                pieces.pop()
                low = pieces.pop()[1][len(_RANGE):]
            else:
                pieces.append((True, token))
            continue
        if kind == "string":
            value = _literal(token)
            if low is not None:
                pieces.append((False, _units(_range(low, value), 0)))
                low = None
            elif len(value) == 1 and text[m.end():].lstrip().startswith(".."):
                pieces.append((False, _RANGE + value))
            else:
                pieces.append((False, _escaped_literal(value, token.endswith('"i'))))
        else:
            body, flags = token[1:].rsplit("/", 1)
            pieces.append((False, _units(body.replace("\\/", "/"), _flags(flags))))
    pieces.append((True, text[at:]))
    if low is not None or any(t.startswith(_RANGE) for _, t in pieces):
        raise ValueError("a one-character literal and '..' need a literal after them")
    terminals = {m.group(2) for plain, t in pieces if plain for m in _DEFINITION.finditer(t)}
    terminals |= set(imports)

    def rename(plain_text: str) -> str:  # terminals become rules: NAME -> esc_name
        plain_text = _DEFINITION.sub(lambda m: m.group(1) + m.group(2) + m.group(3), plain_text)
        return _NAME.sub(lambda m: _rule(m.group()) if m.group() in terminals else m.group(),
                         plain_text)

    out = "".join(rename(t) if plain else t for plain, t in pieces)
    for name in dict.fromkeys(imports):
        body, flags = COMMON[name][1:].rsplit("/", 1)
        out += f"\n{_rule(name)}: {_units(body, _flags(flags))}"
    return out + "\n"


def _rule(terminal: str) -> str:
    return "esc_" + terminal.lower()


def _imported(directive: str) -> list[str]:
    if "->" in directive:
        raise ValueError("'%import ... -> NAME' is not supported inside a JSON string")
    names = re.findall(r"[A-Z_][A-Z0-9_]*", directive.split("common", 1)[1])
    unknown = [n for n in names if n not in COMMON]
    if unknown:
        raise ValueError(f"'%import common.{unknown[0]}' is not one of the common terminals "
                         f"known here ({', '.join(COMMON)})")
    return names


def _literal(token: str) -> str:
    try:
        value = ast.literal_eval(token[:-1] if token.endswith('"i') else token)
    except (ValueError, SyntaxError):
        raise ValueError(f"the literal {token} is not a string") from None
    if not isinstance(value, str) or not value:
        raise ValueError(f"the literal {token} is not a non-empty string")
    return value


def _range(low: str, high: str) -> str:
    if len(low) != 1 or len(high) != 1 or low > high:
        raise ValueError(f"'{low}'..'{high}' is not a range of characters")
    return f"[{re.escape(low)}-{re.escape(high)}]"


def _flags(letters: str) -> int:
    return (re.I if "i" in letters else 0) | (re.S if "s" in letters else 0) | (
        re.X if "x" in letters else 0)


def _char(c: str, ignore_case: bool) -> str:
    """One character as a one-lexeme Lark expression."""
    if c in ESCAPE:
        return json.dumps(ESCAPE[c])
    return json.dumps(c, ensure_ascii=False) + ("i" if ignore_case and c.isalpha() else "")


def _escaped_literal(value: str, ignore_case: bool) -> str:
    return "(" + " ".join(_char(c, ignore_case) for c in value) + ")"


# --------------------------------------------------------------------------------- regexes

def _hex(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}"


def _units(pattern: str, flags: int) -> str:
    try:
        parsed = sre.parse(pattern, flags)
    except re.error as exc:
        raise ValueError(f"the regex /{pattern}/ does not parse: {exc}") from None
    return _sequence(list(parsed), parsed.state.flags)


def _sequence(items: list[tuple[Any, Any]], flags: int) -> str:
    if not items:
        raise ValueError("an empty regex group cannot be written inside a JSON string")
    return "(" + " ".join(_item(op, arg, flags) for op, arg in items) + ")"


_CATEGORIES = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
               C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W"}


def _in_category(c: str, category: Any) -> bool:
    """Python's meaning, as Lark's (its \\s takes \\x1c-\\x1f too; those are escaped anyway)."""
    return re.fullmatch(_CATEGORIES[category], c) is not None


def _class_item(op: Any, arg: Any) -> tuple[str, Callable[[str], bool]]:
    """(Rust class text, membership test) of one item of a [...] set."""
    if op is C.LITERAL:
        return _hex(chr(arg)), lambda c: c == chr(arg)
    if op is C.RANGE:
        lo, hi = arg
        return f"{_hex(chr(lo))}-{_hex(chr(hi))}", lambda c: lo <= ord(c) <= hi
    if op is C.CATEGORY and arg in _CATEGORIES:
        return _CATEGORIES[arg], lambda c: _in_category(c, arg)
    raise ValueError(f"the regex set item {op} {arg} is not supported inside a JSON string")


def _one_char(op: Any, arg: Any, flags: int) -> tuple[str, list[str]]:
    """(Rust class of what the item matches, the specials among it) for one-character items."""
    if op is C.NOT_LITERAL:
        return f"[^{_hex(chr(arg))}]", [c for c in SPECIAL if c != chr(arg)]
    if op is C.ANY:
        if flags & re.S:
            return r"[\x{0}-\x{10ffff}]", list(SPECIAL)
        return r"[^\x{a}]", [c for c in SPECIAL if c != "\n"]
    negate = bool(arg) and arg[0][0] is C.NEGATE
    items = [_class_item(o, a) for o, a in (arg[1:] if negate else arg)]
    inside = "".join(text for text, _ in items)
    chosen = [c for c in SPECIAL if any(test(c) for _, test in items) != negate]
    return f"[{'^' if negate else ''}{inside}]", chosen


def _item(op: Any, arg: Any, flags: int) -> str:
    if op is C.LITERAL:
        return _char(chr(arg), bool(flags & re.I))
    if op in (C.NOT_LITERAL, C.ANY, C.IN):
        cls, specials = _one_char(op, arg, flags)
        safe = f"[{cls}{NOT_SPECIAL}]"
        # one lexeme for the whole character, escaped or not: an alternative per escape
        # would multiply the parser's items by up to 35 at every character
        options = [f"(?i:{safe})" if flags & re.I else safe]
        options += ["".join(_hex(e) for e in ESCAPE[c]) for c in specials]
        return "/" + "|".join(options) + "/"
    if op is C.SUBPATTERN:
        _group, add, remove, body = arg
        return _sequence(list(body), (flags | add) & ~remove)
    if op is C.BRANCH:
        return "(" + " | ".join(_sequence(list(b), flags) for b in arg[1]) + ")"
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # lazy or greedy: the same language
        low, high, body = arg
        x = _sequence(list(body), flags)
        if high is C.MAXREPEAT:
            return {0: f"{x}*", 1: f"{x}+"}.get(low, f"{x}~{low} {x}*")
        if (low, high) == (0, 1):
            return f"{x}?"
        return f"{x}~{low}" if low == high else f"{x}~{low}..{high}"
    what = {C.AT: "anchors", C.GROUPREF: "back-references", C.ASSERT: "look-around",
            C.ASSERT_NOT: "look-around"}.get(op, str(op).lower())
    raise ValueError(f"{what} cannot be written inside a JSON string")
