"""No reply hands a client a tool call it cannot use: a named `tool_choice` yields exactly one
call, and a call cut by the token limit is dropped, whole or streamed.

The "model" here is scripted: it keeps writing calls, one after another, as a small model does
when nothing stops it. The grammar `chat_output` builds for the request decides what it may
write; the reader (gateway/generation/tool_stream.py) decides what reaches the client. The
expectation is independent of both: where each scripted call's text ends.
"""
from __future__ import annotations

import json

import pytest

from engine.constraint import TokenizerAdapter
from engine.tool_formats import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    MistralArgsFormat,
    MistralFormat,
    ToolFormat,
)
from gateway import protocol as p
from gateway.generation.structured import chat_output
from gateway.generation.tool_stream import ReplyReader, finish_reason
from tests.support.fake_vocab import ByteVocabulary

SPECIALS = ["<|python_tag|>", "[TOOL_CALLS]", "[ARGS]"]
VOCAB = ByteVocabulary(SPECIALS)
ADAPTER = TokenizerAdapter(VOCAB)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
ARGS = '{"city": "Paris"}'
CALL = '{"name": "get_weather", "arguments": ' + ARGS + "}"


def repeated_calls(fmt: ToolFormat, n: int) -> tuple[str, list[int]]:
    """A reply of `n` calls in `fmt`'s syntax, and the offset where each call's text is whole."""
    text, ends = "", []
    for i in range(n):
        if isinstance(fmt, MistralArgsFormat):
            text += "[TOOL_CALLS]get_weather[ARGS]" + ARGS
        elif isinstance(fmt, MistralFormat):
            text += ("[TOOL_CALLS][" if i == 0 else ", ") + CALL
        elif isinstance(fmt, GenericFormat):
            text += ('{"tool_calls": [' if i == 0 else ", ") + CALL
        elif isinstance(fmt, Llama3Format):
            text += CALL  # one call is the whole reply in this family
        else:
            text += "<tool_call>\n" + CALL
        ends.append(len(text))
        if isinstance(fmt, HermesFormat):
            text += "\n</tool_call>"
    return text + ("]" if isinstance(fmt, MistralFormat) and not isinstance(
        fmt, MistralArgsFormat) else "]}" if isinstance(fmt, GenericFormat) else ""), ends


FORMATS = [HermesFormat(VOCAB.special_id), MistralFormat(VOCAB.special_id),
           MistralArgsFormat(VOCAB.special_id), GenericFormat(VOCAB.special_id),
           Llama3Format(VOCAB.special_id)]


def named_request(**extra: object) -> p.ChatCompletionRequest:
    return p.ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        **extra})


def scripted_run(fmt: ToolFormat, grammar: str, script: str) -> str:
    """What a model that wants to write `script` writes under `grammar`: each next token of the
    script while the grammar allows it; once refused, end of generation as soon as the grammar
    allows it, until then the first token it allows that is not whitespace (closing brackets)."""
    constraint = ADAPTER.compile(grammar)
    wanted = VOCAB.encode(script, parse_special=True)
    written: list[int] = []
    while len(written) < len(wanted) and constraint.allowed()[wanted[len(written)]]:
        assert constraint.consume(wanted[len(written)])
        written.append(wanted[len(written)])
    for _ in range(16):
        allowed = constraint.allowed()
        if allowed[VOCAB.eos_id]:
            return b"".join(VOCAB.token_bytes(t) for t in written).decode()
        token = next(t for t in range(VOCAB.n_vocab) if allowed[t] and t not in b" \t\r\n")
        assert constraint.consume(token)
        written.append(token)
    raise AssertionError("the grammar left the model no way to end")


@pytest.mark.parametrize("fmt", FORMATS[:4], ids=lambda f: f.family)
@pytest.mark.parametrize("parallel", [True, False])
def test_a_named_tool_choice_yields_exactly_one_call(fmt, parallel):
    out = chat_output(named_request(parallel_tool_calls=parallel), fmt)
    assert out.grammar is not None
    script, _ = repeated_calls(fmt, 5)
    reader = ReplyReader(fmt)
    reader.push(scripted_run(fmt, out.grammar, script))
    reader.finish()
    calls = reader.message().tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]


def test_required_still_allows_parallel_calls():
    fmt = FORMATS[0]
    out = chat_output(named_request(tool_choice="required"), fmt)
    assert out.grammar is not None
    script, _ = repeated_calls(fmt, 3)
    reader = ReplyReader(fmt)
    reader.push(scripted_run(fmt, out.grammar, script))
    reader.finish()
    assert len(reader.message().tool_calls or []) == 3


def streamed(fmt: ToolFormat, text: str, step: int) -> tuple[list[str], list[str]]:
    """Names and argument texts a streaming client assembles from the deltas."""
    reader, names, args = ReplyReader(fmt), [], []
    deltas = [d for i in range(0, len(text), step) for d in reader.push(text[i:i + step])]
    for delta in deltas + reader.finish():
        for call in delta.tool_calls or []:
            if call.id is not None:
                names.append(call.function.name)
                args.append("")
            args[call.index] += call.function.arguments or ""
    return names, args


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.family)
def test_a_call_cut_by_the_token_limit_never_reaches_the_client(fmt):
    text, ends = repeated_calls(fmt, 1 if isinstance(fmt, Llama3Format) else 3)
    for cut in range(1, len(text) + 1):
        prefix = text[:cut]  # where max_tokens stopped the model
        expected = sum(end <= cut for end in ends)
        for step in (1, 5):
            names, args = streamed(fmt, prefix, step)
            assert names == ["get_weather"] * expected, (prefix, step)
            assert [json.loads(a) for a in args] == [{"city": "Paris"}] * expected, (prefix, step)
        whole = ReplyReader(fmt)
        whole.push(prefix)
        whole.finish()
        calls = whole.message().tool_calls or []
        assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}] * expected
        assert finish_reason("length", whole) == "length"
