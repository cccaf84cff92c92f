"""Tool calls per family, over the real chat templates in tests/data/templates/ (the models'
public templates, as llama.cpp keeps them in models/templates/).

The independent expectation is each template itself: it renders an assistant message that
carries tool calls in the form the model was trained to write, so the text it renders for such
a message is a valid model reply. The reader must get the calls back from it, the grammar must
accept it, and the grammar must refuse replies that break the rules (a tool not offered,
arguments that miss the schema, text before a required call).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from engine.chat import ChatTemplate
from engine.constraint import TokenizerAdapter, lark_grammar
from engine.tool_formats import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    MistralArgsFormat,
    MistralFormat,
    ToolFormat,
    detect,
)
from gateway.generation.tool_stream import ReplyReader
from tests.support.fake_vocab import ByteVocabulary
from tests.support.paths import DATA

TEMPLATES = DATA / "templates"
SPECIALS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "[TOOL_CALLS]",
            "[ARGS]", "<|start_header_id|>", "<|end_header_id|>", "<end_of_turn>"]
VOCAB = ByteVocabulary(SPECIALS)
ADAPTER = TokenizerAdapter(VOCAB)

TOOLS = [
    {"name": "get_weather", "description": "Weather for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"enum": ["C", "F"]}},
                    "required": ["city"]}},
    {"name": "add", "description": "Add two integers",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                     "b": {"type": "integer"}},
                    "required": ["a", "b"]}},
]
CALL = {"id": "call_0123456789abcdef01234567", "type": "function",
        "function": {"name": "add", "arguments": {"a": 2, "b": 40}}}
TURN_ENDS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<end_of_turn>"]


@dataclass
class Case:
    template: str
    family: type[ToolFormat]
    bos: str = ""
    eos: str = ""


CASES = [
    Case("Qwen-Qwen2.5-7B-Instruct", HermesFormat),
    Case("Qwen-Qwen3-0.6B", HermesFormat),
    Case("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", HermesFormat, "<|begin_of_text|>"),
    Case("meta-llama-Llama-3.1-8B-Instruct", Llama3Format, "<|begin_of_text|>"),
    Case("meta-llama-Llama-3.2-3B-Instruct", Llama3Format, "<|begin_of_text|>"),
    Case("mistralai-Mistral-Nemo-Instruct-2407", MistralFormat, "<s>", "</s>"),
    Case("unsloth-mistral-Devstral-Small-2507", MistralArgsFormat, "<s>", "</s>"),
    Case("google-gemma-2-2b-it", GenericFormat, "<bos>"),
]


def fmt_for(case: Case) -> ToolFormat:
    return detect((TEMPLATES / f"{case.template}.jinja").read_text(), VOCAB.special_id)


def template_for(case: Case) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / f"{case.template}.jinja").read_text(), bos_token=case.bos,
                        eos_token=case.eos)


def conversation(system: bool = True) -> list[dict]:
    return ([{"role": "system", "content": "You are helpful."}] if system else []) + [
        {"role": "user", "content": "What is 2 + 40?"}]


def model_reply(case: Case) -> str:
    """The text the template renders for an assistant message with CALL: a valid reply."""
    fmt, template = fmt_for(case), template_for(case)
    tools = [{"type": "function", "function": t} for t in TOOLS]
    history = conversation(system=False)  # Nemo moves a system message into the last user turn
    msgs, tt = fmt.prompt(history, tools)
    prompt = template.render(msgs, add_generation_prompt=True, tools=tt)
    full_msgs, tt = fmt.prompt(history + [{"role": "assistant", "content": "",
                                           "tool_calls": [CALL]}], tools)
    full = template.render(full_msgs, add_generation_prompt=False, tools=tt)
    common = 0
    while common < min(len(prompt), len(full)) and prompt[common] == full[common]:
        common += 1
    reply = full[common:]
    for end in TURN_ENDS:
        reply = reply.split(end)[0]
    return reply


def accepts(fmt: ToolFormat, choice: str, parallel: bool, text: str) -> bool:
    c = ADAPTER.compile(lark_grammar(fmt.grammar(TOOLS, choice, parallel)))
    for token in VOCAB.encode(text, parse_special=True):
        if not c.allowed()[token]:
            return False
        assert c.consume(token)
    return c.accepting


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.template)
def test_the_family_is_detected_from_the_template(case):
    assert type(fmt_for(case)) is case.family


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.template)
def test_a_conversation_with_tools_and_results_renders(case):
    fmt, template = fmt_for(case), template_for(case)
    tools = [{"type": "function", "function": t} for t in TOOLS]
    history = conversation(system=case.family is not GenericFormat) + [  # Gemma refuses system
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": CALL["id"], "name": "add", "content": "42"},
    ]
    if case.family is MistralFormat:  # Nemo wants user/assistant turns to alternate after it
        history.append({"role": "assistant", "content": "It is 42."})
        history.append({"role": "user", "content": "And the weather in Paris?"})
    msgs, tt = fmt.prompt(history, tools)
    text = template.render(msgs, add_generation_prompt=True, tools=tt)
    assert "get_weather" in text and "Weather for a city" in text   # the tools are offered
    assert "42" in text                                              # the tool result is there
    assert '"a": 2' in text and "40" in text                         # and the call it answers


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.template)
def test_a_reply_the_template_writes_is_read_back_and_accepted(case):
    fmt = fmt_for(case)
    reply = model_reply(case)
    read = fmt.read(reply, final=True)
    assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [("add", {"a": 2, "b": 40})]
    assert read.content == ""
    for choice in ("required", "add", "auto"):
        assert accepts(fmt, choice, True, reply), (choice, reply)
    assert not accepts(fmt, "get_weather", True, reply)  # a named choice allows only that tool


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.template)
def test_the_grammar_refuses_what_breaks_the_rules(case):
    fmt = fmt_for(case)
    reply = model_reply(case)
    assert not accepts(fmt, "required", True, reply.replace('"add"', '"mul"').replace("add[", "mul["))
    assert not accepts(fmt, "required", True, reply.replace("40", '"forty"'))
    assert not accepts(fmt, "required", True, "Sure! " + reply)
    assert not accepts(fmt, "required", True, "It is 42.")
    plain = "It is 42." if case.family is not GenericFormat else '{"response": "It is 42."}'
    assert accepts(fmt, "auto", True, plain)


@pytest.mark.parametrize("case", [c for c in CASES if c.family in (HermesFormat, MistralFormat,
                                                                     MistralArgsFormat,
                                                                     GenericFormat)],
                         ids=lambda c: c.template)
def test_parallel_calls_only_when_allowed(case):
    fmt = fmt_for(case)
    one = model_reply(case)
    if case.family is GenericFormat:
        two = one.replace("}]}", "}, " + one[len('{"tool_calls": ['):-2] + "]}")
    elif case.family is MistralFormat:
        body = one[len("[TOOL_CALLS]"):].strip()
        two = "[TOOL_CALLS]" + body[:-1] + ", " + body[1:]
    else:  # another block after the first (a thinking span comes once)
        two = one + one[one.find(fmt.marker):]
    assert len(fmt.read(two, final=True).calls) == 2
    assert accepts(fmt, "required", True, two)
    assert not accepts(fmt, "required", False, two)
    assert accepts(fmt, "required", False, one)


def test_thinking_stays_free_and_is_returned_as_reasoning():
    fmt = HermesFormat(thinking=True)
    reply = '<think>\nThe user wants a sum.\n</think>\n\n<tool_call>\n' \
            '{"name": "add", "arguments": {"a": 2, "b": 40}}\n</tool_call>'
    assert accepts(fmt, "required", True, reply)
    read = fmt.read(reply, final=True)
    assert read.reasoning == "The user wants a sum." and read.content == ""
    assert [c.name for c in read.calls] == ["add"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.template)
@pytest.mark.parametrize("prefix", ["", "Let me check. "])
def test_streamed_deltas_add_up_to_the_whole_message_and_hide_markers(case, prefix):
    fmt = fmt_for(case)
    reply = model_reply(case)
    expected = ""
    if prefix and case.family in (HermesFormat, MistralFormat, MistralArgsFormat):
        expected = prefix.strip()
        at = reply.find("</think>")  # free text comes after a thinking span
        at = 0 if at < 0 else len(reply) - len(reply[at + len("</think>"):].lstrip())
        reply = reply[:at] + prefix + reply[at:]
    stream = ReplyReader(fmt)
    content, args, names = "", [""], []
    for i in range(0, len(reply), 3):  # three characters at a time
        for delta in stream.push(reply[i:i + 3]):
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.id is not None:
                    assert call.function.arguments == "" and call.type == "function"
                    names.append(call.function.name)
                else:
                    assert call.function.name is None
                    args[call.index] += call.function.arguments
    for delta in stream.finish():
        content += delta.content or ""
        for call in delta.tool_calls or []:
            args[call.index] += call.function.arguments or ""
    whole = ReplyReader(fmt)
    whole.push(reply)
    whole.finish()
    message = whole.message()
    assert content == (message.content or "") == expected
    assert names == [c.function.name for c in message.tool_calls] == ["add"]
    assert args == [c.function.arguments for c in message.tool_calls]
    assert json.loads(args[0]) == {"a": 2, "b": 40}
    for marker in ("<tool_call", "[TOOL_CALLS", "<|python_tag", "{"):
        assert marker not in content


def test_plain_text_streams_as_it_comes_except_a_possible_marker_start():
    stream = ReplyReader(HermesFormat())
    sent = [d.content for d in stream.push("Hello <tool") if d.content]
    assert sent == ["Hello"]
    sent = [d.content for d in stream.push("box>") if d.content]
    assert sent == [" <toolbox>"]


def test_generic_note_explains_the_reply_format_and_history_becomes_plain_turns():
    fmt = GenericFormat()
    history = conversation() + [{"role": "assistant", "content": "", "tool_calls": [CALL]},
                                {"role": "tool", "tool_call_id": CALL["id"], "name": "add",
                                 "content": "42"}]
    msgs, tools = fmt.prompt(history, [{"type": "function", "function": t} for t in TOOLS])
    assert tools is None
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("You are helpful.")
    no_system, _ = fmt.prompt(conversation(system=False), [{"type": "function", "function": TOOLS[0]}])
    assert [m["role"] for m in no_system] == ["user"]
    assert no_system[0]["content"].endswith("What is 2 + 40?") and "get_weather" in no_system[0]["content"]
    assert '"tool_calls"' in msgs[0]["content"] and "get_weather" in msgs[0]["content"]
    assert json.loads(msgs[2]["content"]) == {"tool_calls": [{"name": "add",
                                                             "arguments": {"a": 2, "b": 40}}]}
    assert msgs[3]["role"] == "user" and "42" in msgs[3]["content"]


def test_a_schema_applies_after_a_free_thinking_span():
    from engine.tool_formats import ThinkingFormat

    fmt = detect((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(), VOCAB.special_id)
    assert fmt.thinking
    thinking = ThinkingFormat()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    grammar = lark_grammar(thinking.json_after_thinking(schema))

    def ok(text: str) -> bool:
        c = ADAPTER.compile(grammar)
        for token in VOCAB.encode(text):
            if not c.allowed()[token]:
                return False
            c.consume(token)
        return c.accepting

    assert ok('<think>\nany {text} here\n</think>\n\n{"a": 1}')
    assert ok('{"a": 1}')
    assert not ok('Sure: {"a": 1}')
    assert not ok('<think>x</think>{"a": "one"}')
    read = thinking.read('<think>\nhm\n</think>\n\n{"a": 1}', final=True)
    assert read.reasoning == "hm" and read.content == '{"a": 1}'


def test_the_generic_format_reads_a_thinking_span_before_its_object():
    # a template with <think> but no tool syntax (the tiny thinking templates, Gemma-likes)
    fmt = GenericFormat(VOCAB.special_id, thinking=True)
    call = '{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 40}}]}'
    read = fmt.read("<think>add them</think>\n" + call, final=True)
    assert read.reasoning == "add them" and read.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [("add", {"a": 2, "b": 40})]
    assert fmt.read('<think>hm</think>{"response": "hi"}', final=True).content == "hi"
    assert fmt.read("<think>still thinking", final=False).content == ""
