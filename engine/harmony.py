"""gpt-oss's Harmony format: a reply is a run of messages on channels, read into reasoning,
tool calls and content.

The prompt ends with `<|start|>assistant`, so the first message's role is already written:

    <|channel|>analysis<|message|>chain of thought<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>

A message is `header <|message|> body`, closed by <|end|> (more follows), <|call|> or
<|return|> (end of generation: the engine stops there, so those two never reach the text).
The header names the channel and, for a tool call, the recipient (`to=functions.NAME`, before
or after the channel: the docs write it after, gpt-oss's own template before). Read as:

    analysis                     -> reasoning (content when thinking is off: reasoning_format
                                    "none" returns what the model wrote)
    to=functions.NAME            -> a call to NAME, arguments the JSON body
    final, commentary, none      -> content (commentary without a recipient is a preamble the
                                    user may see)
    to=anything else             -> dropped: a built-in tool (browser, python) we never offer

Messages of one kind are joined by a newline. Every marker is a control token of the
vocabulary, so replies are decoded with them kept (`keeps_markers`). While streaming, a suffix
that may begin a marker is held back, and an open message returns only what can no longer
change, so the streamed reply adds up to the whole one. Harmony writes one call per reply
(<|call|> ends generation), so `parallel` cannot give more.

The grammar (`required` or a named tool: a call at once; `auto`: analysis messages, then a final
answer or a call) writes the markers as their tokens, `<[id]>`; `reasoning_effort` reaches the
template as the low / medium / high it reads.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .tool_call_text import CallText, skip_ws, value_end
from .tool_format_base import _JSON_OPTIONS, Choice, Reply, ToolFormat, _offered

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN, CONSTRAIN = "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"
MARKERS = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)
_CLOSERS = (END, CALL, RETURN)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
FUNCTIONS = "functions."
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high"}


def _held_back(text: str) -> str:
    """`text` without a suffix that may be the start of a marker."""
    tail = text[-max(len(m) for m in MARKERS):]
    for k in range(len(tail), 0, -1):
        piece = tail[-k:]
        if any(m.startswith(piece) and m != piece for m in MARKERS):
            return text[:-k]
    return text


def _piece(body: str, done: bool) -> str:
    return body.strip() if done else body.lstrip().rstrip()


def _join(pieces: list[str]) -> str:
    return "\n".join(p for p in pieces if p)


class HarmonyFormat(ToolFormat):
    family = "harmony"
    marker = CHANNEL
    reads_own_reasoning = True  # no ThinkingFormat in its place when no tools are offered

    def __init__(self, special: Callable[[str], int | None] = lambda text: None,
                 thinking: bool = True) -> None:
        super().__init__(special, thinking)

    @property
    def keeps_markers(self) -> bool:
        return True  # without them the channels cannot be told apart

    def template_vars(self, variables: dict[str, Any]) -> dict[str, Any]:
        """The effort as the template's "Reasoning: low|medium|high" line takes it (gpt-oss
        always reasons: "none" and "minimal" are its lowest level)."""
        effort = variables.get("reasoning_effort")
        if effort is None and variables.get("enable_thinking") is False:
            effort = "low"
        if effort is None:
            return variables
        return {**variables, "reasoning_effort": EFFORTS.get(str(effort), str(effort))}

    # -- grammar ---------------------------------------------------------------------------------
    def _header(self, channel: str) -> str:
        return f'{self._mark(CHANNEL)} "{channel}"'

    def _analyses(self) -> str:
        return (f'analysis: {self._header("analysis")} {self._mark(MESSAGE)} TEXT '
                f'{self._mark(END)} {self._mark(START)} "assistant"\n')

    def _call_rule(self, tools: list[dict[str, Any]], choice: Choice) -> str:
        alternatives = [
            f'{self._header("commentary")} " to={FUNCTIONS}{t["name"]} " {self._mark(CONSTRAIN)}'
            f' "json" {self._mark(MESSAGE)} '
            f'{self._arguments(t, {"type": "object"})} {self._mark(CALL)}'
            for t in _offered(tools, choice)]
        return "call: " + " | ".join(alternatives) + "\n"

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        text = "TEXT: /(?s:.*)/\n"
        if choice == "auto":
            final = f'final: {self._header("final")} {self._mark(MESSAGE)} TEXT\n'
            return (_JSON_OPTIONS + "start: analysis* (final | call)\n" + self._analyses()
                    + final + self._call_rule(tools, choice) + text)
        return (_JSON_OPTIONS + "start: analysis* call\n" + self._analyses()
                + self._call_rule(tools, choice) + text)

    def json_after_thinking(self, schema: dict[str, Any] | bool) -> str:
        """Lark text: analysis messages, then a final message that is JSON valid against
        `schema`."""
        body = schema if isinstance(schema, dict) else {}
        final = f'final: {self._header("final")} {self._mark(MESSAGE)} {self._json(body)}\n'
        return (_JSON_OPTIONS + "start: analysis* final\n" + self._analyses() + final
                + "TEXT: /(?s:.*)/\n")

    # -- reading ---------------------------------------------------------------------------------
    def read(self, text: str, final: bool) -> Reply:
        if not final:
            text = _held_back(text)
        elif MESSAGE not in text:  # no Harmony at all: what the model wrote is the answer
            return Reply(content=text.strip())
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[CallText] = []
        for message in text.split(START):
            head, sep, body = message.partition(MESSAGE)
            if not sep:
                continue  # a header still being written
            ends = [at for at in (body.find(c) for c in _CLOSERS) if at >= 0]
            closed = bool(ends)
            if ends:
                body = body[:min(ends)]
            done = closed or final  # the end of generation cut <|call|> / <|return|> off
            recipient = _RECIPIENT.search(head)
            channel = _CHANNEL_NAME.search(head)
            if recipient is not None and recipient.group(1) != "assistant":
                if recipient.group(1).startswith(FUNCTIONS):
                    calls.append(_call(recipient.group(1)[len(FUNCTIONS):], body, done))
            elif channel is not None and channel.group(1) == "analysis":
                (reasoning if self.thinking else content).append(_piece(body, done))
            else:
                content.append(_piece(body, done))
        return Reply(content=_join(content), reasoning=_join(reasoning), calls=calls)


def _call(name: str, body: str, done: bool) -> CallText:
    start = skip_ws(body, 0)
    end = value_end(body, start) if start < len(body) else None
    if end is None:
        return CallText(name, body.strip(), False)
    return CallText(name, body[start:end], done)
