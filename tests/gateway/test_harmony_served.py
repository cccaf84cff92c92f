"""gpt-oss's Harmony through the official openai client: a tiny random model served with the real
gpt-oss template (tests/data/templates/) and Harmony's control tokens in its vocabulary.

A random model writes no Harmony of its own, so grammars make it: a GBNF grammar for an
analysis message then a final one, and the Harmony tool grammar for a named tool_choice. The
expectation is the format itself: what the grammar made the model write between the markers
must come back as reasoning_content, tool_calls and content, whole and streamed alike. The
tool grammar lets an analysis message come first, whose text is free: seed 2 is a model whose
greedy choice goes to the call at once (a random model's analysis never ends by itself).
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from engine.harmony import MARKERS
from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import DATA
from tests.support.servers import write_config

TEMPLATE = DATA / "templates" / "openai-gpt-oss-120b.jinja"
REPLY = ('root ::= "<|channel|>analysis<|message|>" [a-z]{3,8} "<|end|><|start|>assistant'
         '<|channel|>final<|message|>" [a-z]{3,8}')
TOOLS = [{"type": "function", "function": {
    "name": "pick", "description": "Pick a mode",
    "parameters": {"type": "object", "properties": {"mode": {"enum": ["x", "y"]},
                                                    "n": {"type": "integer", "minimum": 0,
                                                          "maximum": 9}},
                   "required": ["mode", "n"]}}}]
ASK = [{"role": "user", "content": "Pick one."}]


@pytest.fixture(scope="module")
def server(module_apps: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("harmony")
    model = write_tiny_llama(d / "tiny.gguf", seed=2, extra_specials=MARKERS)
    config = write_config(d / "modelyard.yaml", {"models": [
        {"model": str(model), "aliases": ["oss"], "n_ctx": 2048, "temperature": 0.0,
         "chat_template": str(TEMPLATE)}]})
    return module_apps.serve(config)


def test_analysis_and_final_are_split_whole_and_streamed(server: Any) -> None:
    kwargs: dict[str, Any] = dict(model="oss", messages=ASK, max_tokens=200,
                                  extra_body={"grammar": REPLY})
    whole = server.client.chat.completions.create(**kwargs).choices[0]
    reasoning = whole.message.model_extra["reasoning_content"]
    content = whole.message.content
    assert reasoning.isalpha() and content.isalpha()  # the [a-z] spans, no marker text
    streamed_reasoning = streamed_content = ""
    for chunk in server.client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            streamed_reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            streamed_content += choice.delta.content or ""
    assert (streamed_reasoning, streamed_content) == (reasoning, content)


def test_named_tool_is_a_harmony_call_whole_and_streamed(server: Any) -> None:
    kwargs: dict[str, Any] = dict(model="oss", messages=ASK, tools=TOOLS, max_tokens=400,
                                  tool_choice={"type": "function", "function": {"name": "pick"}})
    whole = server.client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    (call,) = whole.message.tool_calls
    assert call.function.name == "pick"
    args = json.loads(call.function.arguments)
    assert args["mode"] in ("x", "y") and 0 <= args["n"] <= 9
    assert not any(m in (whole.message.content or "") for m in MARKERS)
    pieces: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in server.client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = pieces.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += (delta.function.name or "") if delta.function else ""
                entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert finish == "tool_calls"
    assert pieces == {0: {"name": "pick", "arguments": call.function.arguments}}
