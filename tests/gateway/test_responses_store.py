"""previous_response_id's store (gateway/api/response_store.py) and the translation of a
Responses request into the chat request it means (gateway/api/responses_input.py)."""
from __future__ import annotations

import json

import pytest

from gateway import protocol as p
from gateway.api import responses_input
from gateway.api.response_store import ResponseStore
from gateway.config import ResponsesSettings
from gateway.errors import APIError
from gateway.protocol import responses as r


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(**settings: object) -> tuple[ResponseStore, Clock, dict[str, ResponsesSettings]]:
    holder = {"s": ResponsesSettings(**settings)}  # type: ignore[arg-type]
    clock = Clock()
    return ResponseStore(lambda: holder["s"], clock), clock, holder


def conversation(text: str) -> list[dict[str, object]]:
    return [{"type": "message", "role": "user", "content": text}]


def test_a_stored_response_gives_back_its_conversation():
    store, _, _ = make()
    store.put("resp_1", conversation("hi"))
    assert store.history("resp_1") == conversation("hi")


def test_the_oldest_go_first_past_the_count():
    store, _, _ = make(store_entries=2)
    for n in range(3):
        store.put(f"resp_{n}", conversation(str(n)))
    with pytest.raises(APIError) as err:
        store.history("resp_0")
    assert err.value.status == 404 and err.value.code == "previous_response_not_found"
    assert store.history("resp_2") == conversation("2") and len(store) == 2


def test_the_oldest_go_first_past_the_bytes():
    one = len(json.dumps(conversation("x" * 100)).encode())
    store, _, _ = make(store_bytes=2 * one + 10)
    for n in range(3):
        store.put(f"resp_{n}", conversation(str(n) * 100))
    assert store.bytes <= 2 * one + 10 and len(store) == 2
    with pytest.raises(APIError):
        store.history("resp_0")


def test_an_entry_larger_than_the_store_is_not_kept():
    store, _, _ = make(store_bytes=10)
    store.put("resp_big", conversation("x" * 100))
    assert len(store) == 0 and store.bytes == 0


def test_entries_expire_after_the_ttl():
    store, clock, _ = make(store_ttl=60)
    store.put("resp_old", conversation("a"))
    clock.now = 30
    store.put("resp_new", conversation("b"))
    clock.now = 61
    with pytest.raises(APIError):
        store.history("resp_old")
    assert store.history("resp_new") == conversation("b")


def test_lowered_bounds_apply_at_once():
    store, _, holder = make(store_entries=5)
    for n in range(5):
        store.put(f"resp_{n}", conversation(str(n)))
    holder["s"] = ResponsesSettings(store_entries=1)
    assert store.history("resp_4") == conversation("4") and len(store) == 1


def test_a_stateless_server_says_so():
    store, _, _ = make(store_entries=0)
    store.put("resp_1", conversation("hi"))
    with pytest.raises(APIError) as err:
        store.history("resp_1")
    assert err.value.status == 400 and "stateless" in err.value.message
    assert err.value.param == "previous_response_id"


# --------------------------------------------------------------------------------- translation

def parse(body: dict[str, object]) -> r.ResponsesRequest:
    return p.parse_request(r.ResponsesRequest, json.dumps(body).encode())


def test_items_become_chat_messages():
    req = parse({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Looking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "shell",
         "arguments": "{\"command\": [\"ls\"]}"},
        {"type": "function_call_output", "call_id": "c1", "output": "README.md"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** x"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"}]})
    turn = responses_input.turn(req, [])
    messages = [m.model_dump(exclude_none=True) for m in turn.chat.messages]
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "tool",
                                             "assistant", "tool"]
    assert messages[2]["content"] == "a\nb"
    assert messages[3]["content"] == "Looking."  # the call joined the turn's text
    assert messages[3]["tool_calls"][0]["function"]["name"] == "shell"
    assert json.loads(messages[5]["tool_calls"][0]["function"]["arguments"]) == {"input": "*** x"}
    assert messages[6] == {"role": "tool", "tool_call_id": "c2", "content": "Done"}


def test_history_comes_before_the_new_input_and_is_stored_with_it():
    req = parse({"input": "again"})
    turn = responses_input.turn(req, conversation("first"))
    assert [m.text() for m in turn.chat.messages] == ["first", "again"]
    assert [i["content"] for i in turn.items] == ["first", "again"]


def test_a_forced_custom_tool_is_freeform_with_its_grammar():
    tool = {"type": "custom", "name": "patch",
            "format": {"type": "grammar", "syntax": "regex", "definition": "a/b+"}}
    turn = responses_input.turn(parse({"input": "x", "tools": [tool],
                                       "tool_choice": {"type": "custom", "name": "patch"}}), [])
    assert turn.freeform == responses_input.Freeform("patch", "start: /a\\/b+/",
                                                     "tools[0].format.definition")
    assert turn.chat.tools is None  # the reply is the input: no call syntax around it
    auto = responses_input.turn(parse({"input": "x", "tools": [tool]}), [])
    assert auto.freeform is None and auto.custom == {"patch"}
    assert auto.chat.tools is not None and auto.chat.tools[0].function.name == "patch"


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": ""}, "input"),
    ({"input": "x", "tools": [{"type": "function", "name": "f"}],
      "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"input": "x", "tool_choice": {"type": "custom", "name": "nope"}}, "tool_choice"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(body, param):
    with pytest.raises(APIError) as err:
        responses_input.turn(parse(body), [])
    assert err.value.status == 400 and err.value.param == param
