"""Tool calls per model family: how the chat template wants them written, the grammar that
enforces it, and the reader that turns a reply (or a prefix of one, while it streams) back into
text, reasoning and calls.

The family is recognised by the markers its template contains, as llama.cpp does:

    family        the model writes                                        recognised by
    harmony       <|channel|>commentary to=functions.n ..<|message|>{..}   "<|channel|>" +
                  (analysis / final channels: engine/harmony.py)           "<|message|>" (gpt-oss)
    hermes        <tool_call>{"name": n, "arguments": {..}}</tool_call>   "<tool_call>" (Hermes,
                  (one block per call; Qwen3: <think>..</think> first)     Qwen2.5, Qwen3)
    llama3        [<|python_tag|>]{"name": n, "parameters": {..}}          "<|start_header_id|>ipython"
    mistral       [TOOL_CALLS][{"name": n, "arguments": {..}}, ..]         "[TOOL_CALLS]"
    mistral-args  [TOOL_CALLS]n[ARGS]{..} per call                         "[TOOL_CALLS]" + "[ARGS]"
    gemma4        <|tool_call>call:n{key:<|"|>text<|"|>}<tool_call|>       "<|tool_call>call:" or
                  (reasoning in <|channel>thought..<channel|>:             "<|channel>thought"
                  engine/gemma4_format.py)                                 (Gemma 4)
    generic       {"tool_calls": [{"name": n, "arguments": {..}}]}        anything else; a system
                  or {"response": "text"}                                  note tells the model so

`grammar(tools, choice, parallel)` gives Lark text for llguidance. With `auto`, text is free
until the marker appears, then exactly the offered tools' schemas are allowed (the marker is a
lazy lexeme); with `required` or a named tool, a call is forced from the first token. Markers
that are control tokens of the vocabulary are written `<[id]>`, so text can never imitate them.

`read(text, final)` is the single parser: while streaming it returns only what can no longer
change (a suffix that may be the start of a marker is held back), and once final it returns the
answer, so a streamed reply adds up to exactly the whole one.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from .gemma4_format import Gemma4Format
from .harmony import HarmonyFormat
from .tool_call_text import CallText, calls_in, json_string_prefix, read_call, skip_ws, value_end
from .tool_format_base import (
    _JSON_OPTIONS,
    _WS,
    THINK_CLOSE,
    THINK_OPEN,
    Choice,
    Reply,
    ToolFormat,
    _call_schema,
    _freeform,
    _lark_string,
    _offered,
    _settled,
    _union,
    _ws_re,
)

__all__ = ["THINK_CLOSE", "THINK_OPEN", "Choice", "Gemma4Format", "GenericFormat", "HarmonyFormat",
           "HermesFormat", "Llama3Format", "MistralArgsFormat", "MistralFormat", "Reply",
           "ThinkingFormat", "ToolFormat", "detect"]


# --------------------------------------------------------------------------------- families

class HermesFormat(ToolFormat):
    family = "hermes"
    marker = "<tool_call>"
    closer = "</tool_call>"

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        closer = _lark_string(self.closer)
        call = f"{_WS} {self._offered_call_grammar(tools, choice)} {_WS} {closer} {_WS}"
        more = f' ({self._mark(self.marker)} call)*' if parallel else ""
        return self._lazy_after_marker("calls", choice) + f"calls: call{more}\ncall: {call}\n"

    def read(self, text: str, final: bool) -> Reply:
        reasoning, rest, closed = self._split_thinking(text, final)
        reply = Reply(reasoning=reasoning)
        if not closed:
            return reply
        at = rest.find(self.marker)
        reply.content = _settled(rest if at < 0 else rest[:at], self.marker, final or at >= 0)
        if at >= 0:
            for block in rest[at:].split(self.marker)[1:]:
                reply.calls += calls_in(block.split(self.closer)[0], self.args_key)[:1]
        return reply


class Llama3Format(ToolFormat):
    family = "llama3"
    args_key = "parameters"
    marker = "<|python_tag|>"

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        tag = f"{self._mark(self.marker)}? " if self.special(self.marker) is not None else ""
        call = f"call: {tag}{self._offered_call_grammar(tools, choice)}\n"
        if choice == "auto":  # a call is the whole reply; other replies must not start with "{"
            return _JSON_OPTIONS + "start: TEXT | call\nTEXT: /[^{](?s:.*)/\n" + call
        return _JSON_OPTIONS + "start: call\n" + call

    def read(self, text: str, final: bool) -> Reply:
        body = text.lstrip()
        if body.startswith(self.marker):
            body = body[len(self.marker):].lstrip()
        elif not final and (not body or self.marker.startswith(body)):
            return Reply()
        if body.startswith("{"):
            call, _ = read_call(body, 0, self.args_key)
            if call is not None or not final:
                return Reply(calls=[call] if call else [])
        return Reply(content=text.strip() if final else text.lstrip().rstrip())


class MistralFormat(ToolFormat):
    family = "mistral"
    marker = "[TOOL_CALLS]"

    @staticmethod
    def _with_id(schema: dict[str, Any]) -> dict[str, Any]:
        # Nemo writes a 9-character call id after the arguments; we answer with our own ids
        props = {**schema["properties"], "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}
        return {**schema, "properties": props}

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        if _freeform(tools):  # the array written out, so a freeform input can sit inside
            call_id = ' (", \\"id\\": \\"" /[a-zA-Z0-9]{9}/ "\\"")?'
            calls = " | ".join(self._call_object(t, call_id) for t in _offered(tools, choice))
            more = ' (", " call)*' if parallel else ""
            return (self._lazy_after_marker("calls", choice)
                    + f'calls: {_WS} "[" call{more} "]"\ncall: {calls}\n')
        item = _union([self._with_id(_call_schema(t, self.args_key))
                       for t in _offered(tools, choice)])
        array: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        return self._lazy_after_marker("calls", choice) + f"calls: {_WS} {self._json(array)}\n"

    def read(self, text: str, final: bool) -> Reply:
        at = text.find(self.marker)
        reply = Reply(content=_settled(text if at < 0 else text[:at], self.marker,
                                       final or at >= 0))
        if at >= 0:
            reply.calls = calls_in(text[at + len(self.marker):], self.args_key)
        return reply

    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        # Mistral's templates insist on 9-character alphanumeric call ids
        def short(call_id: str) -> str:
            return hashlib.sha1(call_id.encode()).hexdigest()[:9]

        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": short(c["id"])} for c in m["tool_calls"]]
            if m.get("tool_call_id"):
                m["tool_call_id"] = short(m["tool_call_id"])
            out.append(m)
        return out, tools


class MistralArgsFormat(MistralFormat):
    family = "mistral-args"
    args_marker = "[ARGS]"

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        mark, args = self._mark(self.marker), self._mark(self.args_marker)
        alternatives = [f"{_lark_string(t['name'])} {args} "
                        f"{self._arguments(t, {'type': 'object'})}"
                        for t in _offered(tools, choice)]
        more = f" ({mark} call)*" if parallel else ""
        return (self._lazy_after_marker("calls", choice) + f"calls: call{more}\n"
                + "call: " + " | ".join(alternatives) + "\n")

    def read(self, text: str, final: bool) -> Reply:
        at = text.find(self.marker)
        reply = Reply(content=_settled(text if at < 0 else text[:at], self.marker,
                                       final or at >= 0))
        if at < 0:
            return reply
        for block in text[at:].split(self.marker)[1:]:
            name, sep, raw = block.partition(self.args_marker)
            if not sep:
                continue
            end = value_end(raw, skip_ws(raw, 0)) if raw.strip() else None
            reply.calls.append(CallText(name.strip(), raw.strip() if end is None else raw[:end].strip(),
                                        end is not None))
        return reply


GENERIC_CALLS, GENERIC_ANSWER = '{"tool_calls": [', '{"response": '


class GenericFormat(ToolFormat):
    """For templates with no tool syntax: the reply is one JSON object, explained in a system
    note."""
    family = "generic"
    system_note = True

    def schema(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> dict[str, Any]:
        calls: dict[str, Any] = {
            "type": "array", "minItems": 1,
            "items": self._offered_calls(tools, choice)}
        if not parallel:
            calls["maxItems"] = 1
        with_calls = {"type": "object", "properties": {"tool_calls": calls},
                      "required": ["tool_calls"], "additionalProperties": False}
        if choice != "auto":
            return with_calls
        answer = {"type": "object", "properties": {"response": {"type": "string"}},
                  "required": ["response"], "additionalProperties": False}
        return {"anyOf": [with_calls, answer]}

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        if not _freeform(tools):
            return _JSON_OPTIONS + f"start: {self._json(self.schema(tools, choice, parallel))}\n"
        # written out (a freeform input cannot sit in a JSON schema): the same objects, with
        # the schema's separators; every alternative a literal first, as nested grammars
        # must not start where another lexeme could
        more = f" ({_lark_string(', ')} call)*" if parallel else ""
        calls = f'calls: {_lark_string(GENERIC_CALLS)} call{more} "]}}"'
        answer = f'{_lark_string(GENERIC_ANSWER)} %json {{"type": "string"}} "}}"'
        start = "start: calls" if choice != "auto" else f"start: calls | {answer}"
        return (_JSON_OPTIONS + start + "\n" + calls + "\n"
                + f"call: {self._offered_call_grammar(tools, choice)}\n")

    def note(self, tools: list[dict[str, Any]]) -> str:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return ("You can call these tools:\n" + listed + "\n\nReply with one JSON object and "
                'nothing else: {"tool_calls": [{"name": <tool name>, "arguments": <arguments '
                'object>}]} to call tools, or {"response": <your answer as a string>} to '
                "answer directly.")

    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.get("tool_calls"):  # as this format writes them
                calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                         for c in m["tool_calls"]]
                out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls},
                                                                       ensure_ascii=False)})
            elif m["role"] == "tool":  # a template without tools may not know the role
                out.append({"role": "user", "content": f"Result of tool call {m.get('name', '')} "
                            f"({m.get('tool_call_id', '')}): {m.get('content', '')}"})
            else:
                out.append(m)
        if tools:  # in the system message; without one, before the first user turn (some
            # templates, Gemma's among them, refuse a system role)
            note = self.note([t["function"] for t in tools])
            first = next((i for i, m in enumerate(out) if m["role"] in ("system", "user")), None)
            if first is None:
                out.insert(0, {"role": "user", "content": note})
            elif out[first]["role"] == "system":
                out[first] = {**out[first], "content": f"{out[first]['content']}\n\n{note}"}
            else:
                out[first] = {**out[first], "content": f"{note}\n\n{out[first]['content']}"}
        return out, None

    def read(self, text: str, final: bool) -> Reply:
        reasoning, rest, closed = self._split_thinking(text, final)  # a <think> span first
        reply = self._read_object(rest, final) if closed else Reply()
        reply.reasoning = reasoning
        return reply

    def _read_object(self, text: str, final: bool) -> Reply:
        body = text.lstrip()
        if not body:
            return Reply()
        if not body.startswith("{"):
            return Reply(content=text.strip() if final else "")
        head = re.match(r'\{\s*"(\w+)"\s*:\s*', body)
        if head is None:
            return Reply(content=text.strip()) if final else Reply()
        rest = body[head.end():]
        if head.group(1) == "tool_calls":
            return Reply(calls=calls_in(rest, "arguments"))
        if head.group(1) == "response":
            return Reply(content=json_string_prefix(rest, final))
        return Reply(content=text.strip()) if final else Reply()


class ThinkingFormat(ToolFormat):
    """No tools, but a template whose model may think first: the span is read as reasoning."""
    family = "thinking"

    def __init__(self, special: Callable[[str], int | None] = lambda text: None) -> None:
        super().__init__(special, thinking=True)

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        raise ValueError("a thinking format offers no tools")

    def json_after_thinking(self, schema: dict[str, Any] | bool) -> str:
        """Lark text: an optional <think> span, then JSON valid against `schema`."""
        body = schema if isinstance(schema, dict) else {}
        return (_JSON_OPTIONS + f"start: think? {_WS} {self._json(body)}\n"
                + f"think[lazy]: /{_ws_re()}<think>(?s:.*)<\\/think>/\n")

    def read(self, text: str, final: bool) -> Reply:
        reasoning, rest, closed = self._split_thinking(text, final)
        return Reply(content=_settled(rest, "", final) if closed else "", reasoning=reasoning)


# --------------------------------------------------------------------------------- detection

def detect(template: str | None, special: Callable[[str], int | None] = lambda text: None
           ) -> ToolFormat:
    """The family a chat template's markers say (generic when none is recognised)."""
    source = template or ""
    thinking = THINK_OPEN in source
    if "<|channel|>" in source and "<|message|>" in source:  # gpt-oss's Harmony
        return HarmonyFormat(special)
    if "<|tool_call>call:" in source or "<|channel>thought" in source:  # Gemma 4
        return Gemma4Format(special)
    if "<tool_call>" in source:
        return HermesFormat(special, thinking)
    if "[TOOL_CALLS]" in source:
        return (MistralArgsFormat if "[ARGS]" in source else MistralFormat)(special)
    if "<|start_header_id|>ipython" in source or "<|python_tag|>" in source or (
            '"parameters"' in source and "<|start_header_id|>" in source):
        return Llama3Format(special)
    return GenericFormat(special, thinking)  # thinking read without tools (ThinkingFormat)
