"""The Responses wire's output items and their events (gateway/api/responses_wire.py): the
order openai-python's stream helper expects, each event valid as its own type, each item's
.done equal to the sum of its deltas."""
from __future__ import annotations

import json

from openai.types.responses import ResponseOutputItem, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.api.responses_wire import RESPONSES_SSE, OutputBuilder

EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
ITEM: TypeAdapter[ResponseOutputItem] = TypeAdapter(ResponseOutputItem)


def numbered(events: list[dict]) -> list[dict]:
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def test_reasoning_then_text_then_calls():
    b = OutputBuilder(custom={"apply_patch"})
    events = (b.reasoning("Let me ") + b.reasoning("think.") + b.message("Calling ")
              + b.message("now.") + b.call("call_1", "shell") + b.arguments('{"command": ')
              + b.arguments('["ls"]}') + b.call("call_2", "apply_patch")
              + b.arguments('{"input": "*** Begin Patch\\n"}') + b.close("completed"))
    for event in numbered(events):
        EVENT.validate_python(event)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done", "response.output_item.done"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [
        0, 1, 2, 3]
    items = [i.model_dump() for i in b.items]
    for item in items:
        ITEM.validate_python(item)
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call",
                                          "custom_tool_call"]
    assert items[0]["content"][0]["text"] == "Let me think."
    assert items[1]["content"][0]["text"] == "Calling now." and items[1]["status"] == "completed"
    assert json.loads(items[2]["arguments"]) == {"command": ["ls"]}
    assert items[3]["input"] == "*** Begin Patch\n"  # a custom tool called as a function


def test_a_freeform_call_streams_its_raw_input():
    b = OutputBuilder(custom=set())
    events = b.call("call_1", "patch", freeform=True) + b.arguments("ab") + b.arguments("c")
    events += b.close("incomplete")
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert deltas == ["ab", "c"] and b.items[0].model_dump()["input"] == "abc"


def test_frames_name_their_event():
    frame = RESPONSES_SSE.frame({"type": "response.created", "sequence_number": 0})
    head, data, end = frame.split(b"\n", 2)
    assert head == b"event: response.created" and data.startswith(b"data: {")
    assert end == b"\n" and RESPONSES_SSE.end == b""
