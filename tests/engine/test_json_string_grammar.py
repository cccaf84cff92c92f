"""A Lark grammar's language inside a JSON string (engine/json_string_grammar.py).

The expectation is independent of both llguidance and the transform: the `lark` package parses
the original grammar, and `json.dumps` writes the escaped text. For every string s, llguidance
must accept json.dumps(s)[1:-1] under the transformed grammar exactly when `lark` parses s
under the original. Strings are drawn (seeded) over an alphabet heavy in what JSON escapes.
"""
from __future__ import annotations

import functools
import json
import random

import lark
import pytest

from engine.constraint import Constraint, TokenizerAdapter
from engine.json_string_grammar import json_string_lark
from tests.support.fake_vocab import ByteVocabulary
from tests.support.paths import DATA

VOCAB = ByteVocabulary(["<|im_end|>"])
ADAPTER = TokenizerAdapter(VOCAB)
CODEX_PATCH = (DATA / "codex" / "apply_patch.lark").read_text()


@functools.cache
def compiled(grammar: str) -> Constraint:
    return ADAPTER.compile(grammar)


def accepts(grammar: str, text: str) -> bool:
    c = compiled(grammar).copy()
    for token in VOCAB.encode(text, parse_special=False):
        if not c.allowed()[token]:
            return False
        assert c.consume(token)
    return c.accepting


@functools.cache
def lark_parser(grammar: str) -> lark.Lark:
    # lark's Earley cannot take a zero-width regex: /(.*)/ is written /(.+)/? (the same language)
    return lark.Lark(grammar.replace("/(.*)/", "/(.+)/?"), parser="earley")


def lark_parses(grammar: str, text: str) -> bool:
    try:
        lark_parser(grammar).parse(text)
    except lark.LarkError:
        return False
    return True


def escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


PATCHES = [
    '*** Begin Patch\n*** Add File: hello.txt\n+hi "there"\n+back\\slash\ttab\n*** End Patch\n',
    '*** Begin Patch\n*** Update File: src/a.py\n@@ def f():\n-    return "x\\n"\n'
    "+    return 'y'\n*** End of File\n*** Delete File: old.txt\n*** End Patch",
    '*** Begin Patch\n*** Update File: a\n*** Move to: b\n \n+\x07bell\n*** End Patch\n',
]
NOT_PATCHES = [
    "*** Begin Patch\n*** Add File: hello.txt\nhi\n*** End Patch\n",   # a line without "+"
    "*** Begin Patch\n*** End Patch\n",                                 # no hunk
    '*** Begin Patch\n*** Add File: "x"\n+a\n*** End Patch\n\n',        # a blank line after
]


@pytest.mark.parametrize("text", PATCHES + NOT_PATCHES)
def test_the_codex_patch_grammar_inside_a_json_string(text: str) -> None:
    grammar = json_string_lark(CODEX_PATCH)
    assert accepts(grammar, escaped(text)) == lark_parses(CODEX_PATCH, text)
    if "\n" in text:
        assert not accepts(grammar, text)  # a raw newline cannot stand in a JSON string


GRAMMARS = [  # (grammar, sentences of it: the draw mutates them too, to reach the edges)
    ('start: /[a-c"\\\\]{1,4}/ LF? "x"i\n%import common.LF\n', ['a"\\\nX', "cx"]),
    ('start: (/[^a\\n]/ | "q") ("z" | /\\s/)*\n', ["\tz \x1f", '"']),
    ('start: /./s /\\d+|\\w"/ ("a".."d")~1..2\n', ['\n07ad', '\x00_"b']),
    ('start: WORD (WS_INLINE WORD)* NEWLINE?\n%import common (WORD, WS_INLINE, NEWLINE)\n',
     ["ab\tcd\n", "a b"]),
    ('start: /(?i:ab)[\\x00-\\x1f]?/ ESCAPED_STRING?\n%import common.ESCAPED_STRING\n',
     ['aB\x00"q\\"z"', "Ab"]),
]
ALPHABET = 'abcdqxzAB"\\\n\t\x00\x1f 07_'


def draw(rng: random.Random, sentences: list[str]) -> list[str]:
    """Random strings, and the sentences with one character changed, added or dropped."""
    out = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))) for _ in range(150)]
    for _ in range(150):
        s = rng.choice(sentences)
        i = rng.randrange(len(s) + 1)
        out.append(rng.choice([s[:i] + rng.choice(ALPHABET) + s[i + 1:],
                               s[:i] + rng.choice(ALPHABET) + s[i:], s[:i] + s[i + 1:], s]))
    return out


@pytest.mark.parametrize(("grammar", "sentences"), GRAMMARS)
def test_escaped_text_is_accepted_exactly_when_lark_parses_the_text(
        grammar: str, sentences: list[str]) -> None:
    assert all(lark_parses(grammar, s) for s in sentences)
    transformed = json_string_lark(grammar)
    samples = draw(random.Random(29), sentences)
    agreed = [accepts(transformed, escaped(s)) == lark_parses(grammar, s) for s in samples]
    assert all(agreed), [s for s, ok in zip(samples, agreed) if not ok][:5]
    assert 0 < sum(lark_parses(grammar, s) for s in samples) < len(samples)


@pytest.mark.parametrize(("grammar", "says"), [
    ('start: "a" %json {"type": "integer"}\n', "%json"),
    ('start: WORD\n%ignore " "\n%import common.WORD\n', "%ignore"),
    ('start: /a(?=b)/ "b"\n', "look-around"),
    ('start: /^a/\n', "anchors"),
    ('start: "a" <[5]>\n', "<["),
    ('start: NUMBER\n%import common.NUMBER\n', "common terminals"),
])
def test_what_a_json_string_cannot_hold_is_refused_with_a_reason(grammar: str,
                                                                 says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", "\\[")):
        json_string_lark(grammar)
