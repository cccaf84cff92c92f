"""Gemma 4's chat side: the built-in template (engine/chat_formats.py "gemma4") against Google's
own template as llama.cpp keeps it (tests/data/templates/google-gemma-4-31B-it.jinja), the
thinking switch included; the reply reader (engine/gemma4_format.py) on replies written in the
form that template renders a model turn in (thought channel, <|tool_call>call:NAME{..}), whole
and streamed at every cut, with llama.cpp's rules for empty channels and a stray <channel|>;
and the call grammar accepting exactly the call syntax."""
from __future__ import annotations

import json

import pytest

from engine.chat import ChatTemplate
from engine.chat_formats import BUILTIN_TEMPLATES, choose_template, guess_format
from engine.constraint import TokenizerAdapter, lark_grammar
from engine.gemma4_format import Gemma4Format, SyntaxErrorAt, to_json
from engine.tool_formats import detect
from tests.support.fake_vocab import ByteVocabulary
from tests.support.paths import DATA

GOOGLE = ChatTemplate((DATA / "templates" / "google-gemma-4-31B-it.jinja").read_text())
OURS = ChatTemplate(BUILTIN_TEMPLATES["gemma4"])
CONVERSATIONS = [
    [{"role": "user", "content": "  Hi there  "}],
    [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "<|channel>thought\nhm<channel|>Hello!"},
     {"role": "user", "content": "Bye"}],
    [{"role": "developer", "content": "Rules"},
     {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}],
]


@pytest.mark.parametrize("thinking", [None, False, True])
@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_builtin_template_renders_what_googles_renders(messages, thinking, generation_prompt):
    variables = {} if thinking is None else {"enable_thinking": thinking}
    want = GOOGLE.render(messages, add_generation_prompt=generation_prompt, variables=variables)
    assert OURS.render(messages, add_generation_prompt=generation_prompt,
                       variables=variables) == want


def test_the_thinking_switch() -> None:
    """On: <|think|> opens the system turn and the model turn is left open for its thought.
    Off (the default): the generation prompt closes an empty thought."""
    user = [{"role": "user", "content": "Hi"}]
    on = OURS.render(user, variables={"enable_thinking": True})
    off = OURS.render(user)
    assert on == "<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    assert off == "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def test_a_file_without_a_template_gets_gemma4_and_the_reader_is_detected() -> None:
    assert guess_format("gemma4", [])[0] == "gemma4"
    assert guess_format(None, ["<|turn>", "<turn|>", "x"])[0] == "gemma4"
    choice = choose_template({"general.architecture": "gemma4"})
    assert choice.name == "gemma4"
    for source in (GOOGLE.source, choice.source):
        fmt = detect(source)
        assert isinstance(fmt, Gemma4Format) and fmt.reads_own_reasoning and fmt.thinking


THOUGHT_CALL = ('<|channel>thought\nThe user wants weather.<channel|>Checking.'
                '<|tool_call>call:get_weather{city:<|"|>Paris, FR<|"|>,days:3,'
                'opts:{metric:true,tags:[<|"|>a<|"|>,null]}}<tool_call|>')


def test_reads_thought_content_and_calls() -> None:
    reply = Gemma4Format().read(THOUGHT_CALL, final=True)
    assert reply.reasoning == "The user wants weather."
    assert reply.content == "Checking."
    [call] = reply.calls
    assert call.name == "get_weather" and call.complete
    assert json.loads(call.arguments) == {"city": "Paris, FR", "days": 3,
                                          "opts": {"metric": True, "tags": ["a", None]}}


def test_the_templates_own_rendering_of_a_call_reads_back() -> None:
    """Google's template writes an assistant call in the form the model was trained on; the
    reader turns that text back into the same call."""
    args = {"city": "Oslo", "n": 2, "flags": [True, False], "where": {"lat": 59.9}}
    messages = [{"role": "user", "content": "w?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": args}}]}]
    text = GOOGLE.render(messages, add_generation_prompt=False)
    turn = text[text.index("<|turn>model\n"):]
    [call] = Gemma4Format().read(turn, final=True).calls
    assert call.name == "get_weather" and json.loads(call.arguments) == args


def test_llama_cpps_rules_for_empty_channels_and_a_stray_close() -> None:
    fmt = Gemma4Format()
    reply = fmt.read("<|channel><|channel>thought\nx<channel|>Answer<channel|>junk", final=True)
    assert (reply.reasoning, reply.content) == ("x", "Answer")
    assert fmt.read("<|channel>thought\n<channel|>Plain", final=True).content == "Plain"
    assert fmt.read("<|turn>model\nHi", final=True).content == "Hi"


def test_reasoning_format_none_leaves_the_thought_in_the_content() -> None:
    fmt = Gemma4Format(thinking=False)
    reply = fmt.read("<|channel>thought\nx<channel|>Answer", final=True)
    assert reply.reasoning == "" and reply.content == "<|channel>thought\nx<channel|>Answer"


@pytest.mark.parametrize("text", [THOUGHT_CALL, "<|channel>thought\n a b <channel|> Answer  here ",
                                  "no markers at all"])
def test_streamed_reads_only_grow_and_end_at_the_whole_reply(text: str) -> None:
    fmt = Gemma4Format()
    final = fmt.read(text, final=True)
    before = fmt.read("", final=False)
    for cut in range(len(text) + 1):
        now = fmt.read(text[:cut], final=False)
        assert now.content.startswith(before.content) and final.content.startswith(now.content)
        assert now.reasoning.startswith(before.reasoning)
        assert final.reasoning.startswith(now.reasoning)
        assert all(c.name == f.name for c, f in zip(now.calls, final.calls))
        assert [c for c in now.calls if c.complete] == [c for c in final.calls[:len(now.calls)]
                                                         if c.complete and c in now.calls]
        before = now
    assert fmt.read(text, final=False).content == final.content


def test_to_json_refuses_what_is_not_a_gemma_value() -> None:
    assert to_json("{}") == "{}" and to_json('[<|"|>x<|"|>, -1.5e3]') == '["x",-1.5e3]'
    for bad in ("{a:}", '{a:<|"|>open}', "{a:1,}", "{a:1} tail", "{:1}"):
        with pytest.raises(SyntaxErrorAt):
            to_json(bad)


def _matches(grammar: str, vocab: ByteVocabulary, text: str) -> bool:
    """The whole of `text` is a sentence of the grammar (every token taken, and it may end)."""
    constraint = TokenizerAdapter(vocab).compile(grammar)
    return all(constraint.consume(t) for t in vocab.encode(text, parse_special=True)) \
        and constraint.accepting


def test_grammar_accepts_the_call_syntax_and_only_the_offered_tools() -> None:
    vocab = ByteVocabulary(["<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"])
    fmt = Gemma4Format(vocab.special_id)
    tools = [{"name": "get_weather", "parameters": {"type": "object"}},
             {"name": "add", "parameters": {"type": "object"}}]
    required = lark_grammar(fmt.grammar(tools, "required", parallel=False))
    call = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,n:[1,2]}<tool_call|>'
    assert _matches(required, vocab, call)
    assert _matches(required, vocab, "<|channel>thought\nhmm<channel|>" + call)
    assert not _matches(required, vocab, call.replace("get_weather", "other"))
    assert not _matches(required, vocab, "Sure!")
    assert not _matches(required, vocab, call + call)               # one call, not parallel
    named = lark_grammar(fmt.grammar(tools, "add", parallel=False))
    assert not _matches(named, vocab, call)
    assert _matches(named, vocab, "<|tool_call>call:add{a:1,b:2}<tool_call|>")
    auto = lark_grammar(fmt.grammar(tools, "auto", parallel=True))
    assert _matches(auto, vocab, "Just text.")
    assert _matches(auto, vocab, "Let me check." + call + call)
    assert _matches(auto, vocab, "<|channel>thought\nhm<channel|>Checking." + call)
    assert not _matches(auto, vocab, "x<|tool_call>call:nope{}<tool_call|>")
