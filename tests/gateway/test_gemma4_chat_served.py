"""Gemma 4's reply format through the official openai client: a tiny random model served with
Google's Gemma 4 template (tests/data/templates/) and the Gemma 4 markers as control tokens.

A random model writes no Gemma 4 replies of its own, so grammars make it (as
tests/gateway/test_harmony_served.py does for Harmony): a thought channel then text, and the
Gemma 4 call grammar for a named tool_choice. The expectation is the format itself: the
thought comes back as reasoning_content, the call as tool_calls with JSON arguments, whole and
streamed alike; the thinking switch reaches the template.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from engine.gemma4_format import MARKERS
from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import DATA
from tests.support.servers import write_config

TEMPLATE = DATA / "templates" / "google-gemma-4-31B-it.jinja"
REPLY = 'root ::= "<|channel>thought\\n" [a-z]{3,8} "<channel|>" [a-z]{3,8}'
TOOLS = [{"type": "function", "function": {
    "name": "pick", "description": "Pick a mode",
    "parameters": {"type": "object", "properties": {"mode": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "Pick one."}]
PATHS: dict[str, Any] = {}
SPECIALS = (*MARKERS, "<|think|>", "<|tool>", "<tool|>", "<|tool_response>", "<tool_response|>")


@pytest.fixture(scope="module")
def server(module_apps: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("gemma4chat")
    model = write_tiny_llama(d / "tiny.gguf", seed=2, extra_specials=SPECIALS)
    PATHS["model"] = model
    config = write_config(d / "modelyard.yaml", {"models": [
        {"model": str(model), "aliases": ["g4"], "n_ctx": 2048, "temperature": 0.0,
         "chat_template": str(TEMPLATE)}]})
    return module_apps.serve(config)


def test_thought_and_text_are_split_whole_and_streamed(server: Any) -> None:
    kwargs: dict[str, Any] = dict(model="g4", messages=ASK, max_tokens=200,
                                  extra_body={"grammar": REPLY,
                                              "chat_template_kwargs": {"enable_thinking": True}})
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


def test_the_thinking_switch_reaches_the_template(server: Any) -> None:
    """Each API control gives the prompt Google's template renders for that switch: thinking
    on opens the system turn with <|think|>, off (reasoning_effort "none", or by default)
    closes an empty thought after <|turn>model."""
    from engine.chat import ChatTemplate
    from engine.gguf import read_header
    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(read_header(PATHS["model"])[0])
    bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
    template = ChatTemplate(TEMPLATE.read_text(), bos_token=bos)

    def expected(thinking: bool) -> int:  # the template writes BOS's text; no second one
        text = template.render(ASK, variables={"enable_thinking": thinking})
        add_bos = tok.add_bos and not (bos and text.startswith(bos))
        return len(tok.encode(text, add_special=add_bos, parse_special=True))

    def prompt_tokens(**extra: Any) -> int:
        r = server.client.chat.completions.create(model="g4", messages=ASK, max_tokens=1,
                                                  **extra)
        return r.usage.prompt_tokens

    assert expected(True) != expected(False)
    assert prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": True}}) == \
        expected(True)
    assert prompt_tokens(reasoning_effort="none") == expected(False)
    assert prompt_tokens() == expected(False)


def test_named_tool_is_a_gemma4_call_whole_and_streamed(server: Any) -> None:
    kwargs: dict[str, Any] = dict(model="g4", messages=ASK, tools=TOOLS, max_tokens=300,
                                  tool_choice={"type": "function", "function": {"name": "pick"}})
    whole = server.client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    (call,) = whole.message.tool_calls
    assert call.function.name == "pick"
    assert isinstance(json.loads(call.function.arguments), dict)
    assert not any(m in (whole.message.content or "") for m in MARKERS)
    pieces: dict[int, dict[str, str]] = {}
    for chunk in server.client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = pieces.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += (delta.function.name or "") if delta.function else ""
                entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert pieces == {0: {"name": "pick", "arguments": call.function.arguments}}


def test_a_reasoning_budget_closes_gemmas_own_tag(server: Any) -> None:
    """A budget for a Gemma 4 model waits for <|channel>thought and forces <channel|> (not
    <think> / </think>): after 3 thinking tokens the next token is the closing one."""
    from types import SimpleNamespace

    from engine.gguf import read_header
    from engine.tokenizer import Tokenizer
    from engine.tool_formats import detect
    from gateway.generation.reasoning import budget

    tok = Tokenizer.from_metadata(read_header(PATHS["model"])[0])

    def control(text: str) -> int | None:
        token = tok.token_id(text)
        return token if token is not None and tok.is_special(token) else None

    model = SimpleNamespace(tokenizer=tok, tool_format=detect(TEMPLATE.read_text(), control))
    rule = budget(model, 3, inside=False)  # type: ignore[arg-type]
    assert rule is not None
    opened = tok.encode("<|channel>thought", parse_special=True)
    for token in opened + tok.encode("\nabc def")[:3]:
        assert rule.forced() is None
        rule.consume(token)
    assert rule.forced() == tok.token_id("<channel|>")
    assert rule.spent == 3
