"""The Anthropic wire without a model: requests as their chat twins, replies and event streams
rendered from scripted generations, errors in Anthropic's shape.

Expectations come from outside the wire: the anthropic SDK's own stream accumulator
(anthropic.lib.streaming._messages.accumulate_event) must rebuild from our events exactly the
message the whole reply gives, and the event order is checked against the grammar of
Anthropic's streaming reference.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event

from engine.tool_formats import HermesFormat, ThinkingFormat, ToolFormat
from gateway.api import anthropic as routes  # registers the error shape of its paths
from gateway.api import anthropic_request, anthropic_wire
from gateway.errors import APIError, shape_for, to_api_error
from gateway.generation.choices import collect
from gateway.generation.events import Event, Finished, PromptProgress, QueueFullError, TextDelta
from gateway.generation.serving import Plan
from gateway.generation.structured import Output
from gateway.protocol import RequestValidationError, parse_request
from gateway.protocol import anthropic as a

BILLING = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch={};"


def request(**fields: Any) -> a.MessageCreateRequest:
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            **fields}
    return parse_request(a.MessageCreateRequest, json.dumps(body).encode())


# --------------------------------------------------------------------------------- requests

def test_the_billing_line_is_dropped_so_two_turns_share_their_prefix() -> None:
    chats = [anthropic_request.chat_request(request(system=[
        {"type": "text", "text": BILLING.format(nonce)},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ])) for nonce in ("fa690", "0aaa9")]
    assert chats[0].messages[0].content == chats[1].messages[0].content == "You are Claude Code."


def test_a_billing_line_inside_a_block_goes_and_the_rest_stays() -> None:
    text = BILLING.format("eb6c6") + "\nYou are Claude Code...\nx-anthropic-billing-header is a word"
    assert anthropic_request.system_prompt([text]) == (
        "You are Claude Code...\nx-anthropic-billing-header is a word")


def test_a_tool_round_trip_becomes_assistant_tool_calls_and_tool_messages() -> None:
    chat = anthropic_request.chat_request(request(messages=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "two calls", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no station"}]},
            {"type": "text", "text": "Thanks"}]},
    ], tools=[{"name": "weather", "input_schema": {"type": "object"}}]))
    roles = [m.role for m in chat.messages]
    assert roles == ["user", "assistant", "tool", "tool", "user"]
    assistant = chat.messages[1]
    assert assistant.content == "Checking."
    # the thinking block as llama.cpp converts it: the turn's reasoning_content, which
    # templates such as Qwen3's render for the turns after the last user message
    assert assistant.reasoning_content == "two calls"
    assert assistant.for_template()["reasoning_content"] == "two calls"
    assert chat.messages[0].reasoning_content is None
    assert [(c.id, json.loads(c.function.arguments)) for c in assistant.tool_calls or []] == [
        ("toolu_1", {"city": "Paris"}), ("toolu_2", {"city": "Rome"})]
    assert [(m.tool_call_id, m.content) for m in chat.messages[2:4]] == [
        ("toolu_1", "18C"), ("toolu_2", "Error: no station")]
    assert chat.messages[4].content == "Thanks"


@pytest.mark.parametrize(("choice", "expected", "parallel"), [
    ({"type": "auto"}, "auto", True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "none"}, "none", True),
])
def test_tool_choice_maps_to_openais(choice: dict[str, Any], expected: str,
                                     parallel: bool) -> None:
    chat = anthropic_request.chat_request(request(
        tools=[{"name": "t", "input_schema": {"type": "object"}}], tool_choice=choice))
    assert chat.tool_choice == expected
    assert chat.parallel_tool_calls is parallel


def test_a_named_tool_choice_names_the_function() -> None:
    chat = anthropic_request.chat_request(request(
        tools=[{"name": "t", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "t"}))
    assert chat.tool_choice is not None and not isinstance(chat.tool_choice, str)
    assert chat.tool_choice.function.name == "t"


def test_server_tools_are_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="modelyard.anthropic")
    chat = anthropic_request.chat_request(request(tools=[
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "custom", "name": "Read", "description": "read a file",
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        tool_choice={"type": "auto"}))
    assert [t.function.name for t in chat.tools or []] == ["Read"]
    assert "web_search" in caplog.text
    only_server = anthropic_request.chat_request(request(
        tools=[{"type": "web_search_20250305", "name": "web_search"}], tool_choice={"type": "auto"}))
    assert only_server.tools is None and only_server.tool_choice is None


def test_sampling_fields_reach_the_chat_request_and_unset_ones_stay_unset() -> None:
    chat = anthropic_request.chat_request(request(
        temperature=0.25, top_p=0.5, top_k=7, stop_sequences=["END"], stream=True,
        metadata={"user_id": "u-1"}))
    assert (chat.temperature, chat.top_p, chat.top_k, chat.stop, chat.stream, chat.user,
            chat.max_tokens) == (0.25, 0.5, 7, ["END"], True, "u-1", 64)
    bare = anthropic_request.chat_request(request())
    assert {"temperature", "top_p", "top_k"}.isdisjoint(bare.model_fields_set)


@pytest.mark.parametrize(("thinking", "variables", "budget"), [
    ({"type": "enabled", "budget_tokens": 2048}, {"enable_thinking": True}, 2048),
    ({"type": "enabled"}, {"enable_thinking": True}, None),
    ({"type": "disabled"}, {"enable_thinking": False}, 0),
    (None, {}, None),
])
def test_thinking_becomes_the_templates_enable_thinking_and_a_budget(
        thinking: dict[str, Any] | None, variables: dict[str, bool], budget: int | None) -> None:
    from gateway.generation import reasoning

    req = request(**({"thinking": thinking} if thinking else {}))
    settings = reasoning.settings(anthropic_request.chat_request(req))
    assert (settings.template_vars, settings.budget) == (variables, budget)


def test_template_variables_reach_the_template_and_cannot_replace_its_own() -> None:
    from engine.chat import ChatTemplate

    template = ChatTemplate("{{ messages[0]['content'] }}|{{ enable_thinking }}")
    assert template.render([{"role": "user", "content": "x"}],
                           variables={"enable_thinking": False}) == "x|False"
    assert template.render([{"role": "user", "content": "x"}],
                           variables={"messages": [], "enable_thinking": True}) == "x|True"


@pytest.mark.parametrize(("messages", "where"), [
    ([{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "AA=="}}]}],
     "messages[0].content[1]"),
    ([{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}],
     "messages[0].content[0].source"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                    "content": "?"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "The answer is ("}],
     "messages[1]"),
])
def test_what_cannot_be_served_is_a_400_naming_the_block(messages: list[Any], where: str) -> None:
    with pytest.raises(APIError) as info:
        anthropic_request.chat_request(request(messages=messages))
    assert info.value.status == 400 and info.value.message.startswith(where)


def test_an_unknown_block_type_is_a_400_naming_the_block() -> None:
    with pytest.raises(RequestValidationError) as info:
        request(messages=[{"role": "user", "content": [{"type": "hologram", "data": "?"}]}])
    assert "'messages[0].content[0]': Input tag 'hologram'" in info.value.message


# --------------------------------------------------------------------------------- errors

@pytest.mark.parametrize(("error", "status", "kind"), [
    (APIError(400, "bad"), 400, "invalid_request_error"),
    (APIError(401, "who"), 401, "authentication_error"),
    (APIError(403, "no"), 403, "permission_error"),
    (APIError(404, "gone", code="model_not_found"), 404, "not_found_error"),
    (APIError(413, "big"), 413, "request_too_large"),
    (APIError(429, "slow down"), 429, "rate_limit_error"),
    (to_api_error(QueueFullError("m", 4)), 529, "overloaded_error"),
    (APIError(500, "oops", type="server_error"), 500, "api_error"),
])
def test_errors_under_v1_messages_take_anthropics_shape(error: APIError, status: int,
                                                        kind: str) -> None:
    got_status, body = shape_for(routes.PREFIX + "/count_tokens")(error)
    assert (got_status, body["type"], body["error"]) == (
        status, "error", {"type": kind, "message": error.message})
    assert shape_for("/v1/chat/completions")(error) == (error.status, error.body())


def test_a_stream_error_is_a_named_error_event() -> None:
    raw = anthropic_wire.MESSAGES.error(to_api_error(QueueFullError("m", 4)))
    name, data = parse_events(raw)[0]
    assert name == "error" and data["error"]["type"] == "overloaded_error"


# --------------------------------------------------------------------------------- replies

class Scripted:
    """A Generation that yields the given events."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    async def __aiter__(self) -> AsyncIterator[Event]:
        for event in self.events:
            yield event

    def cancel(self) -> None:
        pass


def pieces(text: str, size: int = 3) -> list[Event]:
    return [TextDelta(text[i:i + size], []) for i in range(0, len(text), size)]


def plan_for(events: list[Event], fmt: ToolFormat | None, prompt_tokens: int = 40) -> Plan:
    plan = Plan([], prompt_tokens, output=Output(tool_format=fmt))
    plan.submitted = [Scripted(events)]
    return plan


def parse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        if chunk:
            name, data = chunk.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            payload = json.loads(data[6:])
            assert payload["type"] == name[7:]  # the data names its event too
            out.append((name[7:], payload))
    return out


def stream(req: a.MessageCreateRequest, events: list[Event],
           fmt: ToolFormat | None) -> list[tuple[str, dict[str, Any]]]:
    async def run() -> bytes:
        plan = plan_for(events, fmt)
        return b"".join([e async for e in anthropic_wire.message_events(None, "m", req, plan)])  # type: ignore[arg-type]
    return parse_events(asyncio.run(run()))


def whole(req: a.MessageCreateRequest, events: list[Event], fmt: ToolFormat | None) -> a.Message:
    async def run() -> a.Message:
        plan = plan_for(events, fmt)
        results = await collect(plan.submitted)
        return anthropic_wire.message(None, "m", req, plan_for(events, fmt), results)  # type: ignore[arg-type]
    return asyncio.run(run())


# Anthropic's reference: message_start, then blocks each start-deltas-stop, message_delta, stop;
# ping may come anywhere between blocks
ORDER = re.compile(r"message_start (ping )*(content_block_start (content_block_delta )*"
                   r"content_block_stop (ping )*)+message_delta message_stop")


def check_order(events: list[tuple[str, dict[str, Any]]]) -> None:
    assert ORDER.fullmatch(" ".join(name for name, _ in events)), [n for n, _ in events]
    open_index = -1
    for name, data in events:
        if name == "content_block_start":
            assert data["index"] == open_index + 1
            open_index = data["index"]
        elif name in ("content_block_delta", "content_block_stop"):
            assert data["index"] == open_index


def accumulated(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for name, data in events:
        if name != "ping":
            snapshot = accumulate_event(event=data, current_snapshot=snapshot,  # type: ignore[arg-type]
                                        json_bufs=json_bufs)
    assert snapshot is not None
    return snapshot.to_dict()


def without_ids(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in block.items() if k != "id"} for block in content]


HERMES_REPLY = ('<think>Paris first.</think>\n\nLet me check.<tool_call>\n'
                '{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>')
FINISHED = Finished("stop", prompt_tokens=40, completion_tokens=30, cached_tokens=12)


def test_reasoning_text_and_calls_become_thinking_text_and_tool_use_blocks() -> None:
    message = whole(request(), [*pieces(HERMES_REPLY), FINISHED], HermesFormat(thinking=True))
    content = message.model_dump()["content"]
    assert [b["type"] for b in content] == ["thinking", "text", "tool_use"]
    assert content[0]["thinking"] == "Paris first."
    assert content[1]["text"].strip() == "Let me check."
    assert (content[2]["name"], content[2]["input"]) == ("weather", {"city": "Paris"})
    assert content[2]["id"].startswith("toolu_")
    assert message.stop_reason == "tool_use"
    assert message.usage.model_dump() == {"input_tokens": 28, "output_tokens": 30,
                                          "cache_creation_input_tokens": 0,
                                          "cache_read_input_tokens": 12}


@pytest.mark.parametrize(("reply", "fmt"), [
    (HERMES_REPLY, HermesFormat(thinking=True)),
    ("<think>a long thought, in pieces</think>The answer: 42.", ThinkingFormat()),
    ("Plain text, no format at all.", None),
    ("", None),
])
def test_the_sdk_rebuilds_from_the_stream_exactly_the_whole_reply(reply: str,
                                                                 fmt: ToolFormat | None) -> None:
    events = [PromptProgress(16, 40, 0), PromptProgress(40, 40, 0), *pieces(reply), FINISHED]
    streamed = stream(request(stream=True), events, fmt)
    check_order(streamed)
    rebuilt = accumulated(streamed)
    expected = whole(request(), events, fmt).model_dump(mode="json")
    assert without_ids(rebuilt["content"]) == without_ids(expected["content"])
    assert rebuilt["stop_reason"] == expected["stop_reason"]
    assert rebuilt["usage"]["output_tokens"] == expected["usage"]["output_tokens"]
    assert [n for n, _ in streamed].count("ping") >= 3  # after message_start, per progress


def test_tool_input_streams_as_an_input_json_delta_once_the_call_is_complete() -> None:
    # a call is passed on only when complete (gateway/generation/tool_stream.py): a reply cut
    # mid-call by max_tokens must not have streamed input that is not JSON
    streamed = stream(request(stream=True), [*pieces(HERMES_REPLY, 2), FINISHED],
                      HermesFormat(thinking=True))
    partial = [d["delta"]["partial_json"] for n, d in streamed
               if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert [json.loads(piece) for piece in partial] == [{"city": "Paris"}]
    start = next(d for n, d in streamed if n == "content_block_start"
                 and d["content_block"]["type"] == "tool_use")
    assert start["content_block"]["input"] == {} and start["content_block"]["name"] == "weather"


@pytest.mark.parametrize(("finished", "reason", "sequence"), [
    (Finished("length", 40, 64), "max_tokens", None),
    (Finished("stop", 40, 5, stop_word="END"), "stop_sequence", "END"),
    (Finished("stop", 40, 5, stop_word="</s>"), "end_turn", None),  # not one the client sent
    (Finished("stop", 40, 5), "end_turn", None),
])
def test_stop_reasons(finished: Finished, reason: str, sequence: str | None) -> None:
    req = request(stop_sequences=["END"])
    message = whole(req, [*pieces("some text"), finished], None)
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)
    delta = next(d for n, d in stream(req, [*pieces("some text"), finished], None)
                 if n == "message_delta")
    assert delta["delta"] == {"stop_reason": reason, "stop_sequence": sequence}


def test_a_stream_that_fails_ends_with_the_error_event_and_no_done() -> None:
    from gateway.http.streaming import sse_body

    async def failing() -> AsyncIterator[bytes]:
        yield anthropic_wire.event({"type": "message_start", "message": {}})
        raise QueueFullError("m", 1)

    async def ok() -> AsyncIterator[bytes]:
        yield anthropic_wire.event({"type": "message_stop"})

    async def run(chunks: AsyncIterator[bytes]) -> bytes:
        body = sse_body(chunks, anthropic_wire.MESSAGES.error, anthropic_wire.MESSAGES.framing)
        return b"".join([e async for e in body])

    failed = parse_events(asyncio.run(run(failing())))
    assert [n for n, _ in failed] == ["message_start", "error"]
    assert failed[1][1]["error"]["type"] == "overloaded_error"
    assert asyncio.run(run(ok())) == b'event: message_stop\ndata: {"type": "message_stop"}\n\n'


def test_image_blocks_are_chat_image_parts_where_they_were() -> None:
    chat = anthropic_request.chat_request(request(messages=[{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}]))
    assert chat.messages[0].image_urls() == [(1, "data:image/png;base64,AA=="),
                                             (2, "https://example.com/cat.png")]
    assert chat.messages[0].text() == "look\n<__media__>\n<__media__>"
    assert anthropic_request.image_params(request(messages=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "c"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AA=="}}]}])) == [
        "messages[2].content[1]"]
