"""Tools and structured output end to end on SmolLM2, with the clients people use.

SmolLM2-135M cannot follow a schema unaided, so every valid output here is the constraint's
doing; validity is judged by `jsonschema` and `json`, call shapes by OpenAI's own client types,
and LangChain's parsers. Errors are checked against OpenAI's error shape and status codes.
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.support.paths import DATA
from tests.support.schemas import SCHEMAS
from tests.support.servers import write_config

pytestmark = pytest.mark.real_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}




@pytest.fixture(scope="module")
def server(module_apps, smollm2_path, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [{"model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 2048,
                    "n_parallel": 8}]})
    return module_apps.serve(config)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def checker(schema: dict) -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


# ------------------------------------------------------------------ structured output

def test_json_schema_outputs_validate_100_of_100(server):
    valid = 0
    for i, schema in enumerate(SCHEMAS):
        r = server.client.chat.completions.create(
            model="smol", messages=ask("Give me an example as JSON."), n=10, seed=i,
            # the whole distribution, as OpenAI samples: unset, top_k/top_p/min_p would take
            # llama.cpp's defaults (gateway/generation/defaults.py), under which SmolLM2 can loop on digits
            temperature=1.0, top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0}, max_tokens=200,
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
        for choice in r.choices:
            assert choice.finish_reason == "stop", choice.message.content
            errors = list(checker(schema).iter_errors(json.loads(choice.message.content)))
            assert not errors, (schema, choice.message.content, errors[0].message)
            valid += 1
    assert valid == 100


def test_json_object_gives_an_object_and_text_stays_free(server):
    r = server.client.chat.completions.create(
        model="smol", messages=ask("Describe a cat."), max_tokens=80, temperature=0,
        response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    free = server.client.chat.completions.create(
        model="smol", messages=ask("Describe a cat."), max_tokens=20, temperature=0,
        response_format={"type": "text"})
    plain = server.client.chat.completions.create(
        model="smol", messages=ask("Describe a cat."), max_tokens=20, temperature=0)
    assert free.choices[0].message.content == plain.choices[0].message.content


def test_completions_take_response_format_and_llama_cpp_fields(server):
    schema = SCHEMAS[3]
    r = server.client.completions.create(
        model="smol", prompt="A product:", max_tokens=60, temperature=0,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "p", "schema": schema}}})
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    r = server.client.completions.create(model="smol", prompt="A product:", max_tokens=60,
                                         temperature=0, extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    r = server.client.chat.completions.create(
        model="smol", messages=ask("Yes or no?"), max_tokens=10, temperature=1.0, n=4, seed=3,
        extra_body={"grammar": 'root ::= ("yes" | "no") "!"'})
    assert {c.message.content for c in r.choices} <= {"yes!", "no!"}
    assert all(c.finish_reason == "stop" for c in r.choices)


def test_streamed_structured_output_equals_the_whole(server):
    kwargs = dict(model="smol", messages=ask("A person as JSON."), max_tokens=80, temperature=0,
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "p", "schema": SCHEMAS[0]}})
    whole = server.client.chat.completions.create(**kwargs)
    text = "".join(c.choices[0].delta.content or "" for c in
                   server.client.chat.completions.create(stream=True, **kwargs) if c.choices)
    assert text == whole.choices[0].message.content


# ------------------------------------------------------------------ tool calls

def test_tool_choice_required_gives_exactly_one_well_formed_call(server):
    for seed in range(4):
        r = server.client.chat.completions.create(
            model="smol", messages=ask("What is the weather in Paris?"), tools=[WEATHER, ADD],
            tool_choice="required", parallel_tool_calls=False, seed=seed, temperature=1.0,
            max_tokens=100)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        tool = {"get_weather": WEATHER, "add": ADD}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_a_named_tool_choice_is_enforced(server):
    r = server.client.chat.completions.create(
        model="smol", messages=ask("What is the weather in Paris?"), tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=60, n=3,
        seed=1, temperature=1.0, parallel_tool_calls=False)
    ids = set()
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "add"
        ids.add(call.id)
        jsonschema.validate(json.loads(call.function.arguments), ADD["function"]["parameters"])
    assert len(ids) == 3  # ids are unique


def test_streamed_tool_calls_arrive_as_openai_sends_them_and_equal_the_whole(server):
    kwargs = dict(model="smol", messages=ask("Add 2 and 40."), tools=[ADD, WEATHER],
                  tool_choice="required", max_tokens=80, temperature=0)
    whole = server.client.chat.completions.create(**kwargs).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in server.client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content  # no marker or JSON text leaks into content
        for tc in delta.tool_calls or []:
            if tc.index not in calls:  # the first chunk of a call: id, type, name, ""
                assert tc.id and tc.type == "function" and tc.function.name
                assert tc.function.arguments == ""
                calls[tc.index] = {"name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls]


def test_auto_may_answer_in_text_and_tool_choice_none_offers_nothing(server):
    r = server.client.chat.completions.create(
        model="smol", messages=ask("Say hello."), tools=[WEATHER], max_tokens=60, temperature=0)
    message = r.choices[0].message
    assert (message.content is not None) or message.tool_calls
    none = server.client.chat.completions.create(
        model="smol", messages=ask("Say hello."), tools=[WEATHER], tool_choice="none",
        max_tokens=20, temperature=0)
    plain = server.client.chat.completions.create(
        model="smol", messages=ask("Say hello."), max_tokens=20, temperature=0)
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content == plain.choices[0].message.content


def test_a_conversation_with_calls_and_results_continues(server):
    first = server.client.chat.completions.create(
        model="smol", messages=ask("Add 2 and 40."), tools=[ADD], tool_choice="required",
        max_tokens=60, temperature=0).choices[0].message
    call = first.tool_calls[0]
    history = ask("Add 2 and 40.") + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r = server.client.chat.completions.create(model="smol", messages=history, tools=[ADD],
                                              max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "tool_calls", "length")


# ------------------------------------------------------------------ errors

def error_of(server, body: dict, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    r = httpx.post(server.url + path, json={"model": "smol", "max_tokens": 5, **body}, timeout=60)
    return r.status_code, r.json().get("error", {})


@pytest.mark.parametrize("body,param,words", [
    ({"response_format": {"type": "sound"}}, "response_format.type", "json_schema"),
    ({"tool_choice": "auto"}, "tool_choice", "tools"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "object", "properties": {
            "b": {"type": "string", "pattern": "(?<=x)a"}}}}}}}},
     "response_format.json_schema.schema", "/properties/a/properties/b/pattern"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "minLength": "x"}}}}}},
     "response_format.json_schema.schema", "minLength"),
    ({"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "grammar", "together"),
    ({"grammar": 'root ::= "a"', "tools": [ADD]}, "grammar", "tools"),
    ({"grammar": "root ::= ("}, "grammar", "grammar"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "mul"}}},
     "tool_choice", "mul"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "add", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0]", "messages[1]"),
    ({"messages": [{"role": "user", "content": "x"},
                   {"role": "tool", "tool_call_id": "call_9", "content": "42"}]},
     "messages[1].tool_call_id", "messages[1]"),
])
def test_bad_structured_requests_are_400_naming_the_problem(server, body, param, words):
    body.setdefault("messages", ask("hi"))
    status, error = error_of(server, body)
    assert status == 400, error
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]


# ------------------------------------------------------------------ LangChain

@pytest.fixture(scope="module")
def chat_model(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="smol",
                      temperature=0, max_tokens=80, max_retries=0)


def test_langchain_bind_tools_gets_tool_calls(chat_model):
    bound = chat_model.bind_tools([ADD],
                                  tool_choice="required")
    message = bound.invoke("Add 2 and 40.")
    assert len(message.tool_calls) >= 1 and message.tool_calls[0]["name"] == "add"
    assert set(message.tool_calls[0]["args"]) == {"a", "b"}
    chunks = list(bound.stream("Add 2 and 40."))
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert [(t["name"], t["args"]) for t in merged.tool_calls] == \
        [(t["name"], t["args"]) for t in message.tool_calls]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output_parses(chat_model, method):
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=120)

    structured = chat_model.with_structured_output(Person, method=method)
    person = structured.invoke("Invent a person.")
    assert isinstance(person, Person)
    streamed = list(structured.stream("Invent a person."))
    assert isinstance(streamed[-1], Person) and streamed[-1] == person


# ------------------------------------------------------------------ a Hermes-family template

@pytest.fixture(scope="module")
def qwen_server(module_apps, tmp_path_factory):
    """A tiny random model served with Qwen2.5's template: the hermes family. (Qwen3's would let
    a random model think forever: the <think> span is free; tests/gateway/test_tool_formats.py covers
    it.)"""
    from tests.support.ggufgen import write_tiny_llama

    d = tmp_path_factory.mktemp("qwen")
    model = write_tiny_llama(d / "tiny.gguf", seed=5)
    template = DATA / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    config = write_config(d / "modelyard.yaml", {"models": [
        {"model": str(model), "aliases": ["q"], "n_ctx": 2048, "chat_template": str(template)}]})
    return module_apps.serve(config)


# a random model never ends a number or a string by itself: bounded parameters only
BOUNDED = [{"type": "function", "function": {
    "name": f"tool_{i}", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "word": {"type": "string", "maxLength": 8}, "mode": {"enum": ["x", "y"]}},
        "required": ["n", "word", "mode"]}}} for i in range(3)]


def test_a_hermes_template_gets_calls_in_its_own_format(qwen_server):
    kwargs = dict(model="q", messages=ask("Add 2 and 40."), tools=BOUNDED,
                  tool_choice="required", parallel_tool_calls=False, max_tokens=300,
                  temperature=0)
    whole = qwen_server.client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    (call,) = whole.message.tool_calls
    tool = {t["function"]["name"]: t for t in BOUNDED}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    args, content = "", ""
    for chunk in qwen_server.client.chat.completions.create(stream=True, **kwargs):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            args += tc.function.arguments or ""
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
    assert args == call.function.arguments
    assert content == (whole.message.content or "")
    assert "<tool_call>" not in content and "<think>" not in content



def test_streamed_tool_calls_keep_every_tokens_logprobs(server):
    kwargs = dict(model="smol", messages=ask("Add 2 and 40."), tools=[ADD],
                  tool_choice="required", max_tokens=60, temperature=0, logprobs=True)
    whole = server.client.chat.completions.create(**kwargs).choices[0]
    streamed = [t.token for c in server.client.chat.completions.create(stream=True, **kwargs)
                if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == [t.token for t in whole.logprobs.content]
    assert '"name": "add"' in "".join(streamed)  # the call's own tokens are among them
