"""What every tool-call format shares (engine/tool_formats.py has the families and detect()):
a `Reply` (content, reasoning, calls), the `ToolFormat` base with its grammar helpers, and
`_settled`, which holds back a suffix that may still become a marker while a reply streams.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .constraint import JSON_STYLE
from .tool_call_text import CallText

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class Reply:
    content: str = ""
    reasoning: str = ""
    calls: list[CallText] = field(default_factory=list)


Choice = str  # "auto", "required", or the name of the tool that must be called


def _call_schema(tool: dict[str, Any], args_key: str) -> dict[str, Any]:
    params = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": tool["name"]}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


def _union(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


# A freeform tool (a Responses custom tool) offered beside others is called as a function taking
# {"input": string}; its tool dict names, under this key, the sub-grammar its input follows
# written inside a JSON string; RAW_SUFFIX added to that name: the grammar as written (for
# families whose strings escape nothing, Gemma 4's)
INPUT_GRAMMAR = "input_grammar"
RAW_SUFFIX = "_raw"
FREEFORM_OPEN, FREEFORM_CLOSE = '{"input": "', '"}'


def _freeform(tools: list[dict[str, Any]]) -> bool:
    return any(INPUT_GRAMMAR in t for t in tools)


def _offered(tools: list[dict[str, Any]], choice: Choice) -> list[dict[str, Any]]:
    if choice in ("auto", "required"):
        return tools
    return [t for t in tools if t["name"] == choice]


def _lark_string(text: str) -> str:
    return json.dumps(text)


_JSON_OPTIONS = '%llguidance {}\n'
_WS = r'/[ \t\r\n]{0,4}/'  # bounded: a model must not pad with blank lines forever


class ToolFormat:
    """One family's way of writing calls. `special(text)` gives the id of a control token whose
    text is exactly `text` (None otherwise): markers that are such tokens match only them."""

    family = "generic"
    args_key = "arguments"
    marker = ""
    system_note = False   # True: the template knows no tools; a system message explains the format
    reads_own_reasoning = False  # True: without tools it still reads its replies (no ThinkingFormat)
    think_open, think_close = THINK_OPEN, THINK_CLOSE  # its reasoning block's tags (a budget
    #                                                    forces the closing one)

    def __init__(self, special: Callable[[str], int | None] = lambda text: None,
                 thinking: bool = False) -> None:
        self.special = special
        self.thinking = thinking

    @property
    def keeps_markers(self) -> bool:
        """Replies are decoded with control tokens kept: its markers are such tokens."""
        return self.special(self.marker) is not None

    def template_vars(self, variables: dict[str, Any]) -> dict[str, Any]:
        """The reasoning controls' template variables as this family's template reads them."""
        return variables

    # -- grammar ---------------------------------------------------------------------------------
    def json_after_thinking(self, schema: dict[str, Any] | bool) -> str:
        """Lark text: the reasoning this family writes, then JSON valid against `schema`."""
        raise NotImplementedError

    def _mark(self, text: str) -> str:
        token = self.special(text)
        return f"<[{token}]>" if token is not None else _lark_string(text)

    def _json(self, schema: dict[str, Any]) -> str:
        # fixed separators, as for response_format (a small model pads free whitespace forever)
        return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE})

    def grammar(self, tools: list[dict[str, Any]], choice: Choice, parallel: bool) -> str:
        raise NotImplementedError

    def _lazy_after_marker(self, body: str, choice: Choice) -> str:
        """Free text, or text up to the marker and then `body` (auto); or `body` at once."""
        mark = self._mark(self.marker)
        think = ""
        if self.thinking:
            think = "think? "
        lines = [_JSON_OPTIONS]
        if choice == "auto":
            if self.special(self.marker) is not None:  # text cannot contain a control token
                lines.append(f"start: FREE? | FREE? {mark} {body}")
                lines.append("FREE: /(?s:.+)/")
            else:
                escaped = re.escape(self.marker)
                lines.append(f"start: FREE | pre {body}")
                lines.append(f"FREE: /(?s:.*)/ & ~/(?s:.*){escaped}(?s:.*)/")
                lines.append(f"pre[lazy]: /(?s:.*){escaped}/")
        else:
            lines.append(f"start: {think}{_WS} {mark} {body}")
            if self.thinking:
                lines.append(f"think[lazy]: /{_ws_re()}<think>(?s:.*)<\\/think>/")
        return "\n".join(lines) + "\n"

    # -- prompt ----------------------------------------------------------------------------------
    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """Messages and `tools` (OpenAI's {"type": "function", "function": {...}} entries) as
        this family's template takes them."""
        return messages, tools

    def _offered_calls(self, tools: list[dict[str, Any]], choice: Choice) -> dict[str, Any]:
        """The JSON Schema of one call to any tool `choice` allows."""
        return _union([_call_schema(t, self.args_key) for t in _offered(tools, choice)])

    def _offered_call_grammar(self, tools: list[dict[str, Any]], choice: Choice) -> str:
        """The grammar of one call to any tool `choice` allows, written as a JSON object."""
        offered = _offered(tools, choice)
        if not _freeform(offered):
            return self._json(self._offered_calls(tools, choice))
        return "(" + " | ".join(self._call_object(t) for t in offered) + ")"

    def _call_object(self, tool: dict[str, Any], after: str = "") -> str:
        """One call to `tool` as the JSON object _call_schema describes, written out: the
        literals before and after its arguments are what the schema's grammar writes (fixed
        separators), so a freeform tool's input can sit between them (`after`: more members)."""
        head = "{" + f'"name": {json.dumps(tool["name"])}, "{self.args_key}": '
        return f"{_lark_string(head)} {self._arguments(tool)}{after} {_lark_string('}')}"

    def _arguments(self, tool: dict[str, Any],
                   default: dict[str, Any] | None = None) -> str:
        """A call's arguments: a JSON object valid against the tool's parameters, or, for a
        freeform tool ("input_grammar" names the grammar of its input escaped as a JSON
        string's body: engine/json_string_grammar.py), {"input": "<that text>"}."""
        ref = tool.get(INPUT_GRAMMAR)
        if ref is None:
            return self._json(tool.get("parameters") or default or
                              {"type": "object", "properties": {}})
        return f"{_lark_string(FREEFORM_OPEN)} @{ref} {_lark_string(FREEFORM_CLOSE)}"

    # -- reading ---------------------------------------------------------------------------------
    def read(self, text: str, final: bool) -> Reply:
        raise NotImplementedError

    def _split_thinking(self, text: str, final: bool) -> tuple[str, str, bool]:
        """(reasoning, rest, reasoning_closed) for replies that may open with <think>."""
        stripped = text.lstrip()
        if not self.thinking or not stripped:
            return "", text, True
        if not stripped.startswith(THINK_OPEN):
            if not final and THINK_OPEN.startswith(stripped):
                return "", "", False  # maybe the start of <think>
            return "", text, True
        inner = stripped[len(THINK_OPEN):]
        end = inner.find(THINK_CLOSE)
        if end < 0:
            return (_settled(inner, THINK_CLOSE, final) if not final else inner.strip()), "", final
        return inner[:end].strip(), inner[end + len(THINK_CLOSE):], True


def _ws_re() -> str:
    return r"[ \t\r\n]{0,4}"


def _settled(text: str, marker: str, final: bool) -> str:
    """Text that can no longer change: stripped, and while streaming without trailing
    whitespace or a suffix that may begin `marker`."""
    if final:
        return text.strip()
    text = text.lstrip()
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            text = text[:-k]
            break
    return text.rstrip()
