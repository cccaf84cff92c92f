"""OpenAI's Responses API on SmolLM2, through openai-python unchanged: responses.create and
responses.stream with function and custom tools and text.format json_schema, the event stream's
order and sequence numbers, previous_response_id, input_tokens, and errors in OpenAI's shape.

Replies are judged by the SDK's own types and stream helper, `json`/`jsonschema`, llguidance
itself (a custom tool's input is checked against its grammar by a fresh matcher), and
/v1/chat/completions' answer to the same request (the same engine, seeded: the same text).
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import lark
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.servers import Server, write_config

pytestmark = pytest.mark.real_model

GREEDY = {"temperature": 0, "max_output_tokens": 16}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
# a patch envelope in the spirit of the Codex CLI's freeform apply_patch tool (bounded: a
# small model left free to add lines adds them until max_output_tokens)
PATCH_GRAMMAR = r"""
start: begin hunk hunk? end
begin: "*** Begin Patch" LF
end: "*** End Patch" LF?
hunk: "*** Add File: " FILENAME LF line line? line?
line: "+" /[a-z ]{1,20}/ LF
FILENAME: /[a-z]{1,8}\.txt/
%import common.LF
"""
PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch",
              "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [{"model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 2048,
                    "n_parallel": 4}],
        "responses": {"store_entries": 3}})
    srv = Server(config).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client


def matches(grammar: str, text: str) -> bool:
    """Whether the `lark` package (another implementation than llguidance's) parses `text`
    whole under `grammar`."""
    try:
        lark.Lark(grammar, parser="earley").parse(text)
    except lark.LarkError:
        return False
    return True


def test_create_matches_chat_completions(client):
    reply = client.responses.create(model="smol", input="Name a colour.", **GREEDY)
    chat = client.chat.completions.create(model="smol", temperature=0, max_tokens=16,
                                          messages=[{"role": "user", "content": "Name a colour."}])
    assert reply.object == "response" and reply.model == "smol"
    assert reply.output_text == chat.choices[0].message.content
    assert [item.type for item in reply.output] == ["message"]
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    finished = chat.choices[0].finish_reason
    assert reply.status == ("incomplete" if finished == "length" else "completed")
    if finished == "length":
        assert reply.incomplete_details.reason == "max_output_tokens"


def test_instructions_are_the_system_message(client):
    reply = client.responses.create(model="smol", instructions="Answer in French.",
                                    input=[{"role": "user", "content": [
                                        {"type": "input_text", "text": "Name a colour."}]}],
                                    **GREEDY)
    chat = client.chat.completions.create(model="smol", temperature=0, max_tokens=16, messages=[
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Name a colour."}])
    assert reply.output_text == chat.choices[0].message.content
    assert reply.instructions == "Answer in French."


def test_stream_events_in_order_with_sequence_numbers(client):
    with client.responses.stream(model="smol", input="Say hello.", temperature=0,
                                 max_output_tokens=200) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added",
                          "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == deltas
    whole = client.responses.create(model="smol", input="Say hello.", temperature=0,
                                    max_output_tokens=200)
    assert whole.output_text == final.output_text
    assert final.id == events[0].response.id and final.status == "completed"


def test_function_tool_round_trip(client):
    first = client.responses.create(model="smol", input="What is the weather in Paris?",
                                    tools=[WEATHER], tool_choice="required", temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, WEATHER["parameters"])
    history = [item.model_dump(exclude_none=True) for item in first.output]
    follow = client.responses.create(model="smol", tools=[WEATHER], temperature=0,
                                     max_output_tokens=30, input=[
        {"role": "user", "content": "What is the weather in Paris?"}, *history,
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    assert follow.output and follow.output[-1].type in ("message", "function_call")


def test_function_call_streams_arguments(client):
    with client.responses.stream(model="smol", input="Weather in Oslo?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call = next(item for item in final.output if item.type == "function_call")
    pieces = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    assert pieces == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_custom_lark_tool_is_constrained_exactly(client):
    reply = client.responses.create(model="smol", input="Add a file a.txt saying hi.",
                                    tools=[PATCH_TOOL], max_output_tokens=200, temperature=0.7,
                                    tool_choice={"type": "custom", "name": "apply_patch"})
    calls = [item for item in reply.output if item.type == "custom_tool_call"]
    assert len(calls) == 1 and calls[0].name == "apply_patch"
    assert reply.status == "completed", reply.output
    assert matches(PATCH_GRAMMAR, calls[0].input), calls[0].input
    assert calls[0].input.startswith("*** Begin Patch\n*** Add File: ")


def test_custom_tool_streams_its_input(client):
    with client.responses.stream(model="smol", input="Add a file b.txt.", tools=[PATCH_TOOL],
                                 tool_choice="required", max_output_tokens=200,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call = next(item for item in final.output if item.type == "custom_tool_call")
    pieces = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert pieces == call.input
    done = next(e for e in events if e.type == "response.custom_tool_call_input.done")
    assert done.input == call.input and matches(PATCH_GRAMMAR, call.input)


NOTE_GRAMMAR = 'start: "NOTE: " /[a-z "]{1,20}/\n'  # quotes: the JSON string must escape them
NOTE_TOOL = {"type": "custom", "name": "note", "description": "Write a short note",
             "format": {"type": "grammar", "syntax": "lark", "definition": NOTE_GRAMMAR}}
GRAMMARS = {"apply_patch": PATCH_GRAMMAR, "note": NOTE_GRAMMAR}


@pytest.mark.parametrize("prompt", ["Add a file hello.txt containing hi.",
                                    "Write a note saying hello."])
def test_custom_tools_follow_their_grammars_under_auto(client, prompt):
    # the model may answer or call either tool; SmolLM2 calls one (seeded, greedy), and its
    # input, read back from the JSON string it was written in, is its grammar's to the byte
    reply = client.responses.create(model="smol", input=prompt, tools=[PATCH_TOOL, NOTE_TOOL],
                                    tool_choice="auto", temperature=0, max_output_tokens=120)
    calls = [item for item in reply.output if item.type == "custom_tool_call"]
    assert reply.status == "completed" and len(calls) == 1, reply.output
    assert matches(GRAMMARS[calls[0].name], calls[0].input), calls[0].input


def test_custom_tools_stream_their_input_under_required(client):
    with client.responses.stream(model="smol", input="Write a note saying hello.",
                                 tools=[NOTE_TOOL, PATCH_TOOL], tool_choice="required",
                                 parallel_tool_calls=False,  # as Codex: a small model repeats
                                 temperature=0, max_output_tokens=120) as stream:
        events = list(stream)
        final = stream.get_final_response()
    item = final.output[-1]
    assert final.status == "completed" and item.type == "custom_tool_call", final.output
    done = next(e for e in events if e.type == "response.custom_tool_call_input.done")
    assert done.input == item.input and matches(GRAMMARS[item.name], item.input)
    assert [e.type for e in events].count("response.output_item.done") == len(final.output)


def test_a_grammar_a_json_string_cannot_hold_is_a_400_under_auto(client):
    ignoring = {**NOTE_TOOL, "format": {"type": "grammar", "syntax": "lark", "definition":
                                        'start: "a" "b"\n%ignore " "\n'}}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="smol", input="x", tools=[WEATHER, ignoring])
    assert err.value.body["param"] == "tools[1].format.definition"
    assert "%ignore" in err.value.body["message"]
    broken = {**NOTE_TOOL, "format": {"type": "grammar", "syntax": "lark",
                                      "definition": "start: missing_rule"}}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="smol", input="x", tools=[WEATHER, broken])
    assert err.value.body["param"] == "tools[1].format.definition"
    assert "missing_rule" in err.value.body["message"]


def test_a_broken_grammar_is_a_400_naming_it(client):
    broken = {**PATCH_TOOL, "format": {"type": "grammar", "syntax": "lark",
                                       "definition": "start: missing_rule"}}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="smol", input="x", tools=[broken],
                                tool_choice={"type": "custom", "name": "apply_patch"})
    assert err.value.body["param"] == "tools[0].format.definition"


class Colour(BaseModel):
    name: str = Field(max_length=12)  # bounded: an unbounded string may ramble to the budget
    hex: str = Field(max_length=7)


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "hex": {"type": "string", "maxLength": 7}},
              "required": ["name", "hex"], "additionalProperties": False}
    reply = client.responses.create(model="smol", input="A colour as JSON.", temperature=0,
                                    max_output_tokens=60, text={"format": {
                                        "type": "json_schema", "name": "colour",
                                        "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(reply.output_text), schema)
    parsed = client.responses.parse(model="smol", input="A colour as JSON.", temperature=0,
                                    max_output_tokens=60, text_format=Colour)
    assert isinstance(parsed.output_parsed, Colour)


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model="smol", input="My name is Ada.", **GREEDY)
    follow = client.responses.create(model="smol", input="What is my name?",
                                     previous_response_id=first.id, **GREEDY)
    chat = client.chat.completions.create(model="smol", temperature=0, max_tokens=16, messages=[
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert follow.output_text == chat.choices[0].message.content
    assert follow.previous_response_id == first.id
    counted = client.responses.input_tokens.count(model="smol", input="What is my name?",
                                                  previous_response_id=first.id)
    assert counted.input_tokens == follow.usage.input_tokens


def test_an_evicted_or_unstored_response_is_a_404_never_a_shorter_prompt(client):
    unstored = client.responses.create(model="smol", input="Hi.", store=False, **GREEDY)
    oldest = client.responses.create(model="smol", input="Hi.", **GREEDY)
    for _ in range(3):  # the store keeps 3
        client.responses.create(model="smol", input="Hi.", **GREEDY)
    for gone in (unstored.id, oldest.id):
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model="smol", input="Go on.", previous_response_id=gone)
        assert err.value.body["code"] == "previous_response_not_found"


def test_input_tokens_counts_the_prompt(client):
    counted = client.responses.input_tokens.count(model="smol", input="Name a colour.")
    reply = client.responses.create(model="smol", input="Name a colour.", **GREEDY)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == reply.usage.input_tokens > 0


def test_errors_have_openai_shape(server, client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="smol", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}])
    assert err.value.body["param"] == "input[0].content[0]"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="smol", input="x", tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0]"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="smol", input="x", reasoning={"effort": "high"})
    assert err.value.body["param"] == "reasoning.effort"
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="nope", input="x")
    assert err.value.body["code"] == "model_not_found"
    r = httpx.post(server.url + "/v1/responses", json={"model": "smol", "input": 3})
    assert r.status_code == 400 and set(r.json()["error"]) >= {"message", "type", "param"}
