"""gpt-oss's Harmony replies (engine/harmony.py): detection from the real template, the reader
on hand-written replies, whole and streamed at every cut, and the template's own rendering of a
call read back.

The independent expectations: replies written here from OpenAI's Harmony docs (openai/harmony,
docs/format.md), and gpt-oss's chat template (tests/data/templates/openai-gpt-oss-120b.jinja),
which renders an assistant tool call in the form the model was trained to write.
"""
from __future__ import annotations

import json

import pytest

from engine.chat import ChatTemplate
from engine.constraint import TokenizerAdapter, lark_grammar
from engine.harmony import MARKERS, HarmonyFormat
from engine.tool_formats import HermesFormat, detect
from tests.support.fake_vocab import ByteVocabulary
from tests.support.paths import DATA

TEMPLATE = (DATA / "templates" / "openai-gpt-oss-120b.jinja").read_text()

ANALYSIS_THEN_FINAL = ("<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>"
                       "<|start|>assistant<|channel|>final<|message|>It is 4.")
CALL = ('<|channel|>analysis<|message|>Need the weather tool.<|end|>'
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
        '<|message|>{"city": "Paris", "unit": "C"}')
PREAMBLE_CALL = ('<|channel|>commentary<|message|>Checking the weather.<|end|>'
                 '<|start|>assistant to=functions.get_weather<|channel|>commentary json'
                 '<|message|>{"city":"Oslo"}')
TWO_ANALYSES = ("<|channel|>analysis<|message|>first<|end|><|start|>assistant<|channel|>analysis"
                "<|message|>second<|end|><|start|>assistant<|channel|>final<|message|>done")


def test_detected_from_gpt_oss_template() -> None:
    assert isinstance(detect(TEMPLATE), HarmonyFormat)
    assert detect(TEMPLATE).thinking


def test_other_templates_are_not_harmony() -> None:
    qwen3 = (DATA / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    assert isinstance(detect(qwen3), HermesFormat)


@pytest.mark.parametrize(("text", "content", "reasoning", "calls"), [
    (ANALYSIS_THEN_FINAL, "It is 4.", "User asks 2+2. Easy.", []),
    (CALL, "", "Need the weather tool.", [("get_weather", {"city": "Paris", "unit": "C"})]),
    (PREAMBLE_CALL, "Checking the weather.", "", [("get_weather", {"city": "Oslo"})]),
    (TWO_ANALYSES, "done", "first\nsecond", []),
    ("no markers at all", "no markers at all", "", []),
    ("<|channel|>final<|message|>only an answer<|return|>", "only an answer", "", []),
])
def test_whole_reply(text: str, content: str, reasoning: str,
                     calls: list[tuple[str, dict[str, object]]]) -> None:
    reply = HarmonyFormat().read(text, final=True)
    assert reply.content == content
    assert reply.reasoning == reasoning
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == calls
    assert all(c.complete for c in reply.calls)


def test_thinking_off_keeps_analysis_as_content() -> None:
    reply = HarmonyFormat(thinking=False).read(ANALYSIS_THEN_FINAL, final=True)
    assert reply.reasoning == ""
    assert reply.content == "User asks 2+2. Easy.\nIt is 4."


def test_builtin_tool_recipient_is_not_a_call() -> None:
    text = '<|channel|>analysis<|message|>x<|end|><|start|>assistant to=python<|channel|>' \
           'analysis<|message|>print(1)'
    reply = HarmonyFormat().read(text, final=True)
    assert reply.calls == [] and reply.reasoning == "x"


@pytest.mark.parametrize("text", [ANALYSIS_THEN_FINAL, CALL, PREAMBLE_CALL, TWO_ANALYSES])
def test_every_streamed_prefix_extends_the_last_and_ends_as_the_whole(text: str) -> None:
    fmt = HarmonyFormat()
    whole = fmt.read(text, final=True)
    last_content = last_reasoning = ""
    for cut in range(len(text) + 1):
        part = fmt.read(text[:cut], final=False)
        assert part.content.startswith(last_content), (cut, part.content, last_content)
        assert part.reasoning.startswith(last_reasoning), (cut, part.reasoning)
        assert whole.content.startswith(part.content) and whole.reasoning.startswith(
            part.reasoning), cut
        assert not any(m[:2] in part.content + part.reasoning for m in MARKERS), cut
        assert not any(c.complete for c in part.calls)  # a call completes with the reply
        last_content, last_reasoning = part.content, part.reasoning


def test_partial_marker_is_held_back() -> None:
    reply = HarmonyFormat().read("<|channel|>final<|message|>Hello <|ret", final=False)
    assert reply.content == "Hello"


def test_template_rendering_of_a_call_reads_back() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    history = [{"role": "user", "content": "Weather in Rome?"},
               {"role": "assistant", "content": "", "tool_calls": [call]}]
    before = ChatTemplate(TEMPLATE).render(history[:1], add_generation_prompt=True, tools=tools)
    after = ChatTemplate(TEMPLATE).render(history, add_generation_prompt=False, tools=tools)
    assert after.startswith(before)  # the reply follows the generation prompt
    reply_text = after[len(before):]
    assert reply_text.endswith("<|call|>")
    reply = HarmonyFormat().read(reply_text[:-len("<|call|>")], final=True)
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [
        ("get_weather", {"city": "Rome"})]


@pytest.mark.parametrize(("effort", "expected"), [
    ("high", "high"), ("low", "low"), ("minimal", "low"), ("none", "low")])
def test_reasoning_effort_reaches_the_template(effort: str, expected: str) -> None:
    variables = HarmonyFormat().template_vars({"reasoning_effort": effort})
    text = ChatTemplate(TEMPLATE).render([{"role": "user", "content": "hi"}],
                                         add_generation_prompt=True, variables=variables)
    assert f"Reasoning: {expected}\n" in text


# --------------------------------------------------------------------------------- grammar

GRAMMAR_TOOLS = [{"name": "pick", "parameters": {"type": "object", "properties": {
    "mode": {"enum": ["x", "y"]}}, "required": ["mode"]}}, {"name": "other", "parameters": {}}]
THOUGHT = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant"


VOCAB = ByteVocabulary(list(MARKERS))


def _accepts(grammar: str, text: str) -> bool:
    constraint = TokenizerAdapter(VOCAB).compile(lark_grammar(grammar))
    return all(constraint.consume(t) for t in VOCAB.encode(text, parse_special=True))


def _call(name: str, args: str) -> str:
    return (f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"
            "<|call|>")


@pytest.mark.parametrize(("choice", "text", "accepted"), [
    ("pick", THOUGHT + _call("pick", '{"mode": "x"}'), True),
    ("pick", _call("pick", '{"mode": "y"}'), True),
    ("pick", _call("pick", '{"mode": "z"}'), False),          # outside the schema
    ("pick", _call("other", "{}"), False),                    # not the named tool
    ("required", THOUGHT + "<|channel|>final<|message|>hi", False),  # no call
    ("auto", THOUGHT + "<|channel|>final<|message|>hi", True),
    ("auto", _call("other", "{}"), True),
])
def test_tool_grammar(choice: str, text: str, accepted: bool) -> None:
    fmt = detect(TEMPLATE, VOCAB.special_id)
    assert _accepts(fmt.grammar(GRAMMAR_TOOLS, choice, True), text) is accepted
