"""Gemma 4's reply format: a thought channel, content, and calls in its own value syntax, read
into reasoning, content and tool calls (llama.cpp's common/parsers/gemma4.cpp, its PEG rules and
gemma4_to_json).

The prompt ends with `<|turn>model\\n` (and, thinking off, with an empty thought
`<|channel>thought\\n<channel|>`); the reply is a run of

    <|channel>thought\\n the reasoning <channel|>       -> reasoning (content when the
                                                            reasoning format is "none")
    text up to the next marker                          -> content
    <|tool_call>call:NAME{key:value,...}<tool_call|>    -> a call to NAME
    <|channel> not followed by "thought"                -> an empty channel, skipped
    a <channel|> that closes nothing                    -> the end of the reply

A call's arguments are written in Gemma's syntax: keys bare (any characters but ':' and '}'),
strings between <|"|> quotes (nothing escaped inside), numbers, true, false, null, [..], {..};
`to_json` turns them into the JSON text OpenAI's clients expect. While a reply streams, a
suffix that may begin a marker is held back, an open thought returns what can no longer change,
and an unfinished call gives its name with no arguments yet, so the streamed pieces add up to
the whole reply.

The grammar (llguidance Lark) follows llama.cpp's: `auto` lets a thought and text run until
<|tool_call>, then only calls to the offered tools, their arguments a Gemma dict whose top-level keys are
the tool's declared properties (llama.cpp allows any key; its values are not held to the
schema here either); `required` or a named tool: an optional thought, then the call.
The thinking switch is the template's `enable_thinking` (engine/chat_formats.py's gemma4).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .tool_call_text import CallText
from .tool_format_base import (
    _JSON_OPTIONS,
    INPUT_GRAMMAR,
    RAW_SUFFIX,
    Choice,
    Reply,
    ToolFormat,
    _lark_string,
    _offered,
)

TURN = "<|turn>model\n"
CHANNEL, CHANNEL_END = "<|channel>", "<channel|>"
THOUGHT = "thought"
CALL, CALL_END = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
MARKERS = (CHANNEL, CHANNEL_END, CALL, CALL_END, "<|turn>", "<turn|>", QUOTE)
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WS = re.compile(r"[ \t\r\n]*")
# the grammar's numbers: bounded, so a small model cannot write digits forever
_BOUNDED_NUMBER = r"-?(?:0|[1-9]\d{0,15})(?:\.\d{1,16})?(?:[eE][+-]?\d{1,3})?"


def _held_back(text: str) -> str:
    """`text` without a suffix that may be the start of a marker."""
    for k in range(min(len(text), max(map(len, MARKERS)) - 1), 0, -1):
        piece = text[-k:]
        if any(m.startswith(piece) and m != piece for m in MARKERS):
            return text[:-k]
    return text


class SyntaxErrorAt(ValueError):
    pass


def to_json(text: str) -> str:
    """A Gemma value (the whole text) as JSON text; SyntaxErrorAt where it is not one."""
    value, end = _value(text, 0)
    if _WS.match(text, end).end() != len(text):  # type: ignore[union-attr]
        raise SyntaxErrorAt(f"text after the value at {end}")
    return value


def _value(s: str, i: int) -> tuple[str, int]:
    i = _WS.match(s, i).end()  # type: ignore[union-attr]
    if s.startswith(QUOTE, i):
        end = s.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise SyntaxErrorAt(f"an open string at {i}")
        return json.dumps(s[i + len(QUOTE):end], ensure_ascii=False), end + len(QUOTE)
    if s.startswith("{", i):
        return _items(s, i + 1, "}", keyed=True)
    if s.startswith("[", i):
        return _items(s, i + 1, "]", keyed=False)
    for word in ("true", "false", "null"):
        if s.startswith(word, i):
            return word, i + len(word)
    m = _NUMBER.match(s, i)
    if m is None or not m.group():
        raise SyntaxErrorAt(f"no value at {i}")
    return m.group(), m.end()


def _items(s: str, i: int, close: str, keyed: bool) -> tuple[str, int]:
    parts: list[str] = []
    i = _WS.match(s, i).end()  # type: ignore[union-attr]
    if s.startswith(close, i):
        return ("{}" if keyed else "[]"), i + 1
    while True:
        if keyed:
            colon = s.find(":", i)
            if colon < 0 or "}" in s[i:colon] or colon == i:
                raise SyntaxErrorAt(f"no key at {i}")
            key = s[i:colon].strip()
            value, i = _value(s, colon + 1)
            parts.append(f"{json.dumps(key, ensure_ascii=False)}:{value}")
        else:
            value, i = _value(s, i)
            parts.append(value)
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        if s.startswith(close, i):
            body = ",".join(parts)
            return ("{" + body + "}" if keyed else "[" + body + "]"), i + 1
        if not s.startswith(",", i):
            raise SyntaxErrorAt(f"expected ',' or {close!r} at {i}")
        i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]


class Gemma4Format(ToolFormat):
    family = "gemma4"
    marker = CALL
    reads_own_reasoning = True  # no ThinkingFormat in its place when no tools are offered
    think_open, think_close = CHANNEL + THOUGHT, CHANNEL_END

    def __init__(self, special: Callable[[str], int | None] = lambda text: None,
                 thinking: bool = True) -> None:
        super().__init__(special, thinking)

    @property
    def keeps_markers(self) -> bool:
        return True  # the channels and calls are told apart by them

    # -- grammar ---------------------------------------------------------------------------------
    def _value_rules(self) -> str:
        quote = self._mark(QUOTE)
        if self.special(QUOTE) is not None:  # text cannot contain the quote token
            string = f"g4_string: {quote} G4_TEXT {quote}\nG4_TEXT: /(?s:.*)/\n"
        else:
            string = (f"g4_string: {quote} G4_TEXT {quote}\n"
                      f"G4_TEXT: /(?s:.*)/ & ~/(?s:.*){re.escape(QUOTE)}(?s:.*)/\n")
        return (string
                + "g4_value: g4_string | g4_dict | g4_array | G4_NUMBER | \"true\" | \"false\""
                  " | \"null\"\n"
                + "g4_dict: \"{\" (g4_kv (\",\" g4_kv)*)? \"}\"\n"
                + "g4_kv: G4_KEY \":\" g4_value\n"
                + "G4_KEY: /[^:{}\\[\\],]+/\n"
                + "g4_array: \"[\" (g4_value (\",\" g4_value)*)? \"]\"\n"
                + f"G4_NUMBER: /{_BOUNDED_NUMBER}/\n")

    def _call_rule(self, tools: list[dict[str, Any]], choice: Choice) -> str:
        """call: the marker, "call:", one offered tool's name and its arguments, whose top-level
        keys are the tool's declared properties (when it declares any)."""
        alternatives, rules = [], []
        for i, t in enumerate(_offered(tools, choice)):
            alternatives.append(f'{_lark_string(t["name"])} args{i}')
            if INPUT_GRAMMAR in t:  # a freeform tool: its input between quotes, unescaped
                quote = self._mark(QUOTE)
                rules.append(f'args{i}: "{{input:" {quote} @{t[INPUT_GRAMMAR]}{RAW_SUFFIX} '
                             f'{quote} "}}"\n')
                continue
            props = list((t.get("parameters") or {}).get("properties") or {})
            key = " | ".join(_lark_string(p) for p in props) if props else "G4_KEY"
            rules.append(f'args{i}: "{{" (kv{i} ("," kv{i})*)? "}}"\nkv{i}: ({key}) ":" g4_value\n')
        return (f'call: {self._mark(CALL)} "call:" ({" | ".join(alternatives)}) '
                f"{self._mark(CALL_END)}\n" + "".join(rules) + self._value_rules())

    def _thought_rule(self) -> str:
        close = self._mark(CHANNEL_END)
        if self.special(CHANNEL_END) is not None:
            body = "THOUGHT_TEXT: /(?s:.*)/\n"
        else:
            body = f"THOUGHT_TEXT: /(?s:.*)/ & ~/(?s:.*){re.escape(CHANNEL_END)}(?s:.*)/\n"
        return f'thought: {self._mark(CHANNEL)} "{THOUGHT}" THOUGHT_TEXT {close}\n' + body

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        calls = "call+" if parallel else "call"
        if choice != "auto":
            return (_JSON_OPTIONS + f"start: thought? {calls}\n" + self._thought_rule()
                    + self._call_rule(tools, choice))
        more = "*" if parallel else "?"
        if self.special(CALL) is not None:  # text cannot write the marker: free until it
            return (_JSON_OPTIONS + f"start: thought? TEXT? call{more}\nTEXT: /(?s:.+)/\n"
                    + self._thought_rule() + self._call_rule(tools, choice))
        rule = self._call_rule(tools, choice)  # call: <marker> "call:" ...: its rest after it
        rest = rule.split("\n", 1)[0].split('"call:"', 1)[1]
        return (self._lazy_after_marker("rest", choice)
                + f'rest: "call:" {rest} ({self._mark(CALL)} "call:" {rest}){more}\n'
                + rule.split("\n", 1)[1])

    def json_after_thinking(self, schema: dict[str, Any] | bool) -> str:
        """Lark text: an optional thought, then JSON valid against `schema`."""
        body = schema if isinstance(schema, dict) else {}
        return _JSON_OPTIONS + f"start: thought? {self._json(body)}\n" + self._thought_rule()

    # -- reading ---------------------------------------------------------------------------------
    def read(self, text: str, final: bool) -> Reply:
        if not final:
            text = _held_back(text)
        if text.startswith(TURN):
            text = text[len(TURN):]
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[CallText] = []
        at = 0
        while at < len(text):
            found = [(i, m) for m in (CHANNEL, CHANNEL_END, CALL) if (i := text.find(m, at)) >= 0]
            if not found:
                content.append(text[at:])
                break
            i, marker = min(found)
            content.append(text[at:i])
            at = i + len(marker)
            if marker == CHANNEL_END:  # closes nothing: the reply ends here
                break
            if marker == CALL:
                end = text.find(CALL_END, at)
                call = _call(text[at:] if end < 0 else text[at:end], end >= 0 or final)
                if call.name:
                    calls.append(call)
                if end < 0:
                    break
                at = end + len(CALL_END)
                continue
            if not text.startswith(THOUGHT, at):  # an empty channel
                if not final and THOUGHT.startswith(text[at:]):
                    break  # "thought" may still be coming
                continue
            end = text.find(CHANNEL_END, at)
            body = text[at + len(THOUGHT):] if end < 0 else text[at + len(THOUGHT):end]
            if self.thinking:  # while open, without a tail that may still be stripped
                reasoning.append(body.strip())
            else:  # reasoning format "none": the block stays in the content as written
                content.append(text[i:] if end < 0 else text[i:end + len(CHANNEL_END)])
            if end < 0:
                break
            at = end + len(CHANNEL_END)
        return Reply(content="".join(content).strip(),
                     reasoning="\n".join(r for r in reasoning if r), calls=calls)


def _call(body: str, done: bool) -> CallText:
    """`call:NAME{...}` (the text after <|tool_call>): the name once its '{' is written, the
    arguments as JSON once the call is closed."""
    if not body.startswith("call:"):
        return CallText("", "", False)
    brace = body.find("{", len("call:"))
    if brace < 0:
        return CallText(body[len("call:"):].strip() if done else "", "", False)
    name = body[len("call:"):brace].strip()
    if not done:
        return CallText(name, "", False)
    try:
        return CallText(name, to_json(body[brace:]), True)
    except SyntaxErrorAt:
        return CallText(name, body[brace:], False)
