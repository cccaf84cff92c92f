"""POST /v1/messages and /v1/messages/count_tokens on SmolLM2, through the official anthropic
SDK and LangChain's ChatAnthropic, unchanged.

What the wire says is checked against what the OpenAI chat endpoint of the same server says
for the same conversation (greedy: the same prompt must give the same text and token counts),
tool inputs against their schemas (jsonschema), error bodies against the SDK's error classes.
"""
from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.support.servers import Server, write_config

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

GREEDY = {"temperature": 0}  # the 2026 SDK dropped the sampling arguments; the API kept them
WEATHER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}
WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": WEATHER_SCHEMA}
KEY = "sk-ant-test-key"


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [{"model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 2048,
                    "n_parallel": 4}]})
    srv = Server(config).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def openai_twin(server, text: str, system: str, max_tokens: int) -> Any:
    return server.client.chat.completions.create(
        model="smol", max_tokens=max_tokens, temperature=0,
        messages=[{"role": "system", "content": system}, *ask(text)])


def test_create_says_what_chat_completions_says_for_the_same_conversation(server, client):
    m = client.messages.create(model="smol", max_tokens=24, system="You are terse.",
                               messages=ask("Name a color."), extra_body=GREEDY)
    twin = openai_twin(server, "Name a color.", "You are terse.", 24)
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == twin.choices[0].message.content
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == twin.usage.prompt_tokens
    assert m.usage.output_tokens == twin.usage.completion_tokens
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[
        twin.choices[0].finish_reason]
    assert m.model == "smol" and m.role == "assistant" and m.id.startswith("msg_")


def test_stream_gives_the_same_message_as_create(client):
    kwargs: dict[str, Any] = dict(model="smol", max_tokens=24, messages=ask("Say hello."),
                                  extra_body=GREEDY)
    whole = client.messages.create(**kwargs)
    types: list[str] = []
    with client.messages.stream(**kwargs) as stream:
        for event in stream:
            types.append(event.type)
        text = stream.get_final_text()
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "message_delta" in types and "text" in types


def test_count_tokens_is_what_a_message_bills(server, client):
    system = [{"type": "text", "text": "You help with weather.",
               "cache_control": {"type": "ephemeral"}}]
    counted = client.messages.count_tokens(model="smol", system=system, tools=[WEATHER],
                                           messages=ask("Weather in Oslo?"))
    m = client.messages.create(model="smol", max_tokens=40, system=system, tools=[WEATHER],
                               messages=ask("Weather in Oslo?"), extra_body=GREEDY)
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
    plain = client.messages.count_tokens(model="smol", messages=ask("Weather in Oslo?"))
    twin = server.client.chat.completions.create(model="smol", max_tokens=1,
                                                 messages=ask("Weather in Oslo?"))
    assert plain.input_tokens == twin.usage.prompt_tokens < counted.input_tokens


def test_a_tool_use_round_trip(client):
    first = client.messages.create(model="smol", max_tokens=80, tools=[WEATHER],
                                   tool_choice={"type": "any"}, extra_body=GREEDY,
                                   messages=ask("What is the weather in Paris?"))
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    second = client.messages.create(model="smol", max_tokens=30, tools=[WEATHER],
                                    extra_body=GREEDY, messages=[
        *ask("What is the weather in Paris?"),
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "18 degrees and sunny"}]}])
    assert second.content and second.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_a_named_tool_streams_its_input_as_json_deltas(client):
    with client.messages.stream(model="smol", max_tokens=80, tools=[WEATHER], extra_body=GREEDY,
                                tool_choice={"type": "tool", "name": "get_weather",
                                             "disable_parallel_tool_use": True},
                                messages=ask("Weather in Rome, in celsius?")) as stream:
        deltas = [e.delta.partial_json for e in stream
                  if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    calls = [b for b in final.content if b.type == "tool_use"]
    assert len(calls) == 1 and final.stop_reason == "tool_use"
    assert json.loads("".join(deltas)) == calls[0].input
    jsonschema.validate(calls[0].input, WEATHER_SCHEMA)


def test_stop_sequences_end_the_reply_and_are_named(client):
    free = client.messages.create(model="smol", max_tokens=30, messages=ask("Count: 1, 2, 3,"),
                                  extra_body=GREEDY)
    word = free.content[0].text.split()[1]  # a word the model does write
    m = client.messages.create(model="smol", max_tokens=30, messages=ask("Count: 1, 2, 3,"),
                               stop_sequences=[word], extra_body=GREEDY)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", word)
    assert word not in m.content[0].text


def test_invalid_requests_are_400s_in_anthropics_shape(server, client):
    r = httpx.post(server.url + "/v1/messages", json={"model": "smol", "messages": ask("x")})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="smol", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}]}])
    assert "messages[0].content[0]" in info.value.message
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-opus-4-1", max_tokens=5, messages=ask("x"))
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_langchain_chat_anthropic_works_unchanged(server):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = ChatAnthropic(model="smol", base_url=server.url, api_key="unused", max_tokens=40,
                        temperature=0, max_retries=0)
    reply = llm.invoke("Name a fruit.")
    assert isinstance(reply.content, str | list) and reply.usage_metadata is not None
    assert reply.usage_metadata["input_tokens"] > 0
    streamed = "".join(chunk.text for chunk in llm.stream("Name a fruit."))
    assert streamed == reply.text
    with_tools = llm.bind_tools([WEATHER], tool_choice="get_weather")
    question = HumanMessage("What is the weather in Paris?")
    called = with_tools.invoke([question])
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(called.tool_calls[0]["args"], WEATHER_SCHEMA)
    answer = llm.bind_tools([WEATHER]).invoke([question, called, ToolMessage(
        "18 degrees", tool_call_id=called.tool_calls[0]["id"])])
    assert answer.response_metadata["stop_reason"] in ("end_turn", "max_tokens", "tool_use")


# --------------------------------------------------------------------------------- keys, load

@pytest.fixture(scope="module")
def keyed(smollm2_path, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("keyed") / "modelyard.yaml", {
        "auth": {"keys": [{"name": "claude", "key": KEY}]},
        "models": [{"model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 1024,
                    "n_parallel": 1, "max_queue": 0}]})
    srv = Server(config)
    srv.ready_path = "/health"  # open without a key
    srv.start()
    yield srv
    srv.stop()


def test_keys_come_as_x_api_key_or_bearer_and_refusals_are_anthropics(keyed):
    by_header = anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0)
    assert by_header.messages.count_tokens(model="smol", messages=ask("hi")).input_tokens > 0
    bearer = anthropic.Anthropic(base_url=keyed.url, auth_token=KEY, max_retries=0)
    m = bearer.messages.create(model="smol", max_tokens=2, messages=ask("hi"), extra_headers={
        "anthropic-beta": "interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"})
    assert m.usage.output_tokens >= 1
    wrong = anthropic.Anthropic(base_url=keyed.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model="smol", max_tokens=2, messages=ask("hi"))
    assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_a_full_queue_is_a_529_overloaded_error(keyed):
    client = anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0)
    with client.messages.stream(model="smol", max_tokens=400, extra_body=GREEDY,
                                messages=ask("Write a long story.")) as running:
        next(iter(running))  # message_start: the one slot is taken, no queue behind it
        with pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(model="smol", max_tokens=2, messages=ask("hi"))
    assert info.value.status_code == 529
    assert info.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
