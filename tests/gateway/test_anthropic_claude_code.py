"""Golden replay: the requests Claude Code sends, as its public docs and issue threads show them,
against SmolLM2 behind glob aliases, with every reply's shape checked by the anthropic SDK's
own types.

Claude Code (ANTHROPIC_BASE_URL pointed here) sends, per session: a one-token quota probe and a
topic/title request to the small model (claude-haiku-*); count_tokens for its tools; then the
main turns to claude-sonnet-*: streamed, `system` as text blocks whose first is the
per-request `x-anthropic-billing-header` line (llama.cpp PR #20623, claude-code#68900),
`cache_control` on blocks, its client tools beside server tools (web_search), `thinking`,
`metadata.user_id`, fields newer than the SDK (`context_management`), `?beta=true` on the
path, and `anthropic-version` / `anthropic-beta` headers. A tool turn sends the assistant's
tool_use back with a tool_result (is_error when the command failed).
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

import anthropic.types as t
import httpx
import pytest
from pydantic import TypeAdapter

from tests.support.servers import Server, write_config

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

KEY = "sk-claude-code"
SESSION = str(uuid.uuid4())
HEADERS = {
    "x-api-key": KEY, "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
                      "fine-grained-tool-streaming-2025-05-14,context-management-2025-06-27",
    "x-app": "cli", "user-agent": "claude-cli/2.1.37 (external, cli)",
    "X-Claude-Code-Session-Id": SESSION, "anthropic-dangerous-direct-browser-access": "true",
}
METADATA = {"user_id": f"user_{'ab' * 32}_account__session_{SESSION}"}
SONNET, HAIKU = "claude-sonnet-4-6", "claude-haiku-4-5-20251001"
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(t.RawMessageStreamEvent)

TOOLS = [
    {"name": "Bash", "description": "Executes a given bash command and returns its output.",
     "input_schema": {"type": "object", "properties": {
         "command": {"type": "string", "description": "The command to execute"},
         "description": {"type": "string"}}, "required": ["command"],
         "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}},
    {"name": "Read", "description": "Reads a file from the local filesystem.",
     "input_schema": {"type": "object", "properties": {
         "file_path": {"type": "string"}, "offset": {"type": "number"},
         "limit": {"type": "number"}}, "required": ["file_path"], "additionalProperties": False,
         "$schema": "http://json-schema.org/draft-07/schema#"}},
    {"name": "mcp__files__glob", "description": "Fast file pattern matching.",
     "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}},
                      "required": ["pattern"]}, "cache_control": {"type": "ephemeral"}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
]
INSTRUCTIONS = ("You are an interactive CLI tool that helps users with software engineering "
                "tasks. Use the instructions below and the tools available to you to assist "
                "the user. Be concise. " * 6)


def system(nonce: str) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37.0d9; "
                                 f"cc_entrypoint=cli; cch={nonce};"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}},
    ]


USER_TURN = {"role": "user", "content": [
    {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use "
                             "the following context: the working directory is /repo.\n"
                             "</system-reminder>\n"},
    {"type": "text", "text": "list the python files here", "cache_control": {"type": "ephemeral"}},
]}


def main_turn(nonce: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": SONNET, "max_tokens": 32000, "stream": True, "temperature": 1,
            "system": system(nonce), "messages": messages, "tools": TOOLS,
            "metadata": METADATA, "thinking": {"type": "enabled", "budget_tokens": 31999},
            "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                              "keep": "all"}]}}


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("cc") / "modelyard.yaml", {
        "auth": {"keys": [{"name": "claude-code", "key": KEY}]},
        "models": [{"model": str(smollm2_path), "aliases": ["smol", "claude-*"],
                    "n_ctx": 4096, "n_parallel": 2, "max_tokens": 48}]})
    srv = Server(config)
    srv.ready_path = "/health"
    srv.start()
    yield srv
    srv.stop()


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=HEADERS, timeout=120)


def whole(server: Server, body: dict[str, Any]) -> t.Message:
    r = post(server, "/v1/messages?beta=true", body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    return t.Message.model_validate(r.json())


ORDER = re.compile(r"message_start (ping )*(content_block_start (content_block_delta )*"
                   r"content_block_stop (ping )*)+message_delta message_stop")


def streamed(server: Server, body: dict[str, Any]) -> list[Any]:
    """The stream's events, each validated as the SDK's RawMessageStreamEvent."""
    with httpx.stream("POST", server.url + "/v1/messages?beta=true", json=body, headers=HEADERS,
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events, names = [], []
    for chunk in raw.split("\n\n"):
        if not chunk:
            continue
        name_line, data_line = chunk.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        names.append(name)
        if name != "ping":
            events.append(STREAM_EVENT.validate_python(data))
    assert ORDER.fullmatch(" ".join(names)), names
    return events


def test_the_quota_probe_and_the_topic_request_to_the_small_model(server):
    probe = whole(server, {"model": HAIKU, "max_tokens": 1, "metadata": METADATA,
                           "messages": [{"role": "user", "content": "quota"}]})
    assert probe.usage.output_tokens == 1 and probe.stop_reason in ("max_tokens", "end_turn")
    assert probe.model == HAIKU  # the reply names the model asked for, not the glob
    topic = whole(server, {
        "model": HAIKU, "max_tokens": 512, "temperature": 0, "metadata": METADATA,
        "system": [system("1a2b3")[0], {"type": "text", "text": (
            "Analyze if this message indicates a new conversation topic. If it does, extract a "
            "2-3 word title. Format your response as a JSON object with two fields: "
            "'isNewTopic' (boolean) and 'title' (string, or null if isNewTopic is false).")}],
        "messages": [{"role": "user", "content": "fix the failing test in parser.py"}]})
    assert [b.type for b in topic.content] == ["text"] and topic.content[0].text


def test_count_tokens_for_the_tools(server):
    r = post(server, "/v1/messages/count_tokens?beta=true", {
        "model": SONNET, "tools": TOOLS, "messages": [{"role": "user", "content": "foo"}]})
    assert r.status_code == 200, r.text
    with_tools = t.MessageTokensCount.model_validate(r.json()).input_tokens
    bare = post(server, "/v1/messages/count_tokens?beta=true", {
        "model": SONNET, "messages": [{"role": "user", "content": "foo"}]}).json()["input_tokens"]
    assert with_tools > bare > 0


def test_a_main_turn_streams_in_anthropics_event_shapes(server):
    events = streamed(server, main_turn("fa690", [USER_TURN]))
    start, delta = events[0], events[-2]
    assert isinstance(start, t.RawMessageStartEvent) and start.message.model == SONNET
    assert isinstance(delta, t.RawMessageDeltaEvent)
    assert delta.delta.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for event in events:
        if isinstance(event, t.RawContentBlockStartEvent):
            assert event.content_block.type in ("text", "thinking", "tool_use")
            if event.content_block.type == "tool_use":  # only the client tools are offered
                assert event.content_block.name in ("Bash", "Read", "mcp__files__glob")


def test_a_tool_result_turn_with_an_error(server):
    history = [USER_TURN,
               {"role": "assistant", "content": [
                   {"type": "text", "text": "I'll list them."},
                   {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9",
                    "name": "Bash", "input": {"command": "ls *.py", "description": "List"}}]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                    "is_error": True, "content": "ls: cannot access '*.py': No such file",
                    "cache_control": {"type": "ephemeral"}}]}]
    events = streamed(server, main_turn("0aaa9", history))
    assert isinstance(events[-1], t.RawMessageStopEvent)


def test_a_new_billing_nonce_does_not_break_the_prompt_cache(server):
    body = main_turn("36ee5", [USER_TURN]) | {"stream": False, "temperature": 0,
                                              "max_tokens": 1}
    whole(server, body)
    again = whole(server, body | {"system": system("0aaa9")})
    prompt = again.usage.input_tokens + (again.usage.cache_read_input_tokens or 0)
    # the whole prompt but the token a slot re-reads to sample from
    assert (again.usage.cache_read_input_tokens or 0) >= prompt - 2
