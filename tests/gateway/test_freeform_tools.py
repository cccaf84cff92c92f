"""A freeform tool (a Responses custom tool with a Lark grammar) offered beside functions: every
family's tool grammar takes its call as a function call whose {"input": ...} string holds text
of the tool's grammar (escaped for JSON; Gemma 4's quoted strings escape nothing, so there the
grammar as written), under auto and required alike.

As in test_tool_formats.py, each model's own chat template is the expectation for how a call
is written (it renders an assistant message with the call); the `lark` package is the
expectation for which inputs the tool's grammar takes (the Codex CLI's apply_patch grammar).
"""
from __future__ import annotations

import json

import lark
import pytest

from engine.constraint import lark_grammar, with_subgrammars
from engine.gemma4_format import Gemma4Format
from engine.json_string_grammar import json_string_lark
from engine.tool_format_base import INPUT_GRAMMAR, RAW_SUFFIX
from engine.tool_formats import GenericFormat, ToolFormat, detect
from tests.gateway.test_tool_formats import (
    ADAPTER,
    CASES,
    TEMPLATES,
    TOOLS,
    TURN_ENDS,
    VOCAB,
    Case,
    conversation,
    fmt_for,
    template_for,
)
from tests.support.paths import DATA

CODEX_PATCH = (DATA / "codex" / "apply_patch.lark").read_text()
PATCH_TOOL = {"name": "apply_patch", "description": "Edit files with a patch",
              "parameters": {"type": "object", "properties": {"input": {"type": "string"}},
                             "required": ["input"]},
              INPUT_GRAMMAR: "input_0"}
TOOLS_WITH_PATCH = TOOLS + [PATCH_TOOL]
PATCH = '*** Begin Patch\n*** Update File: a.py\n@@\n-x = "a\\tb"\n+x = 1\n*** End Patch\n'
NOT_A_PATCH = '*** Begin Patch\n*** Update File: a.py\nx = "a\\tb"\n*** End Patch\n'
HARMONY = Case("openai-gpt-oss-120b", ToolFormat)
GEMMA4 = Case("google-gemma-4-31B-it", Gemma4Format)  # its strings escape nothing: the raw grammar
FAMILIES = CASES + [HARMONY, GEMMA4]


def parses(text: str) -> bool:
    parser = lark.Lark(CODEX_PATCH.replace("/(.*)/", "/(.+)/?"), parser="earley")
    try:
        parser.parse(text)
    except lark.LarkError:
        return False
    return True


def rendered_call(case: Case, name: str, arguments: dict[str, object]) -> str:
    """What the template writes for an assistant message calling `name`: a valid reply
    (Harmony's renders the recipient in the header, gpt-oss writes it after the channel)."""
    if case is HARMONY:
        return (f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
                f"{json.dumps(arguments)}<|call|>")
    if case is GEMMA4:  # as Google's template writes one (tests/engine/test_gemma4_chat.py)
        values = {k: f'<|"|>{v}<|"|>' if isinstance(v, str) else json.dumps(v)
                  for k, v in arguments.items()}
        return ("<|tool_call>call:" + name + "{" + ",".join(f"{k}:{v}" for k, v in values.items())
                + "}<tool_call|>")
    fmt = detect((TEMPLATES / f"{case.template}.jinja").read_text(), VOCAB.special_id)
    template = template_for(case)
    tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != INPUT_GRAMMAR}}
             for t in TOOLS_WITH_PATCH]
    call = {"id": "call_0123456789abcdef01234567", "type": "function",
            "function": {"name": name, "arguments": arguments}}
    history = conversation(system=False)
    msgs, tt = fmt.prompt(history, tools)
    prompt = template.render(msgs, add_generation_prompt=True, tools=tt)
    full_msgs, tt = fmt.prompt(history + [{"role": "assistant", "content": "",
                                           "tool_calls": [call]}], tools)
    full = template.render(full_msgs, add_generation_prompt=False, tools=tt)
    common = 0
    while common < min(len(prompt), len(full)) and prompt[common] == full[common]:
        common += 1
    reply = full[common:]
    for end in TURN_ENDS:
        reply = reply.split(end)[0]
    return reply


def accepts(fmt: ToolFormat, choice: str, text: str) -> bool:
    grammar = with_subgrammars(lark_grammar(fmt.grammar(TOOLS_WITH_PATCH, choice, True)),
                               {"input_0": json_string_lark(CODEX_PATCH),
                                "input_0" + RAW_SUFFIX: CODEX_PATCH})
    c = ADAPTER.compile(grammar)
    for token in VOCAB.encode(text, parse_special=True):
        if not c.allowed()[token]:
            return False
        assert c.consume(token)
    return c.accepting


def family(case: Case) -> ToolFormat:
    return fmt_for(case) if case is not HARMONY else detect(
        (TEMPLATES / f"{case.template}.jinja").read_text(), VOCAB.special_id)


@pytest.mark.parametrize("case", FAMILIES, ids=lambda c: c.template)
def test_a_freeform_call_is_taken_only_with_input_its_grammar_parses(case: Case) -> None:
    assert parses(PATCH) and not parses(NOT_A_PATCH)
    fmt = family(case)
    reply = rendered_call(case, "apply_patch", {"input": PATCH})
    read = fmt.read(reply, final=True)
    assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [
        ("apply_patch", {"input": PATCH})]
    for choice in ("auto", "required", "apply_patch"):
        assert accepts(fmt, choice, reply), (choice, reply)
    bad = rendered_call(case, "apply_patch", {"input": NOT_A_PATCH})
    for choice in ("auto", "required"):
        assert not accepts(fmt, choice, bad)


@pytest.mark.parametrize("case", FAMILIES, ids=lambda c: c.template)
def test_functions_beside_a_freeform_tool_keep_their_schemas(case: Case) -> None:
    fmt = family(case)
    reply = rendered_call(case, "add", {"a": 2, "b": 40})
    assert accepts(fmt, "auto", reply) and accepts(fmt, "required", reply)
    assert not accepts(fmt, "required", rendered_call(case, "add", {"a": 2, "b": "forty"}))
    if isinstance(fmt, GenericFormat):
        assert accepts(fmt, "auto", '{"response": "It is 42."}')
