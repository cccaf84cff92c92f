"""Golden replay of the requests the Codex CLI sends to /v1/responses, on SmolLM2.

The request bodies follow codex-rs's ResponsesApiRequest (codex-api/src/common.rs) as its docs
and issue threads show it: `instructions`, the whole history as `input` items every turn (it
stores nothing: `store: false`, `stream: true`), a `shell` function tool and the freeform
`apply_patch` custom tool with its Lark grammar (tests/data/codex), `tool_choice: "auto"`,
`parallel_tool_calls: false`, `reasoning: null`, `include: []`, `prompt_cache_key`. A turn is a
user message; then the shell call and its output; then an apply_patch call and its output with
the assistant's text and a reasoning item. Every reply's SSE frames are checked: an `event:`
line naming the data's type, sequence numbers 0, 1, 2, ..., every event valid as
openai-python's own type, response.completed last with exactly the items of the
output_item.done events, no [DONE]; an apply_patch call's input is parsed by the `lark`
package under Codex's grammar.
"""
from __future__ import annotations

import json
import uuid

import httpx
import lark
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.support.paths import DATA
from tests.support.servers import Server, write_config

pytestmark = pytest.mark.real_model

EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
INSTRUCTIONS = "You are a coding agent running in the Codex CLI. Be concise."
ENVIRONMENT = ("<environment_context>\n  <cwd>/home/user/project</cwd>\n  <approval_policy>"
               "on-request</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n"
               "  <shell>bash</shell>\n</environment_context>")
SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command and returns "
         "its output.", "strict": False, "parameters": {
             "type": "object", "properties": {
                 "command": {"type": "array", "items": {"type": "string"}},
                 "workdir": {"type": "string"}, "timeout_ms": {"type": "number"}},
             "required": ["command"], "additionalProperties": False}}
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "description": "Use the `apply_patch` tool to edit files.",
               "format": {"type": "grammar", "syntax": "lark",
                          "definition": (DATA / "codex" / "apply_patch.lark").read_text()}}


def is_patch(text: str) -> bool:
    """The `lark` package's verdict under Codex's grammar (its Earley takes no zero-width
    regex: /(.*)/ becomes /(.+)/?, the same language)."""
    grammar = str(APPLY_PATCH["format"]["definition"]).replace("/(.*)/", "/(.+)/?")  # type: ignore[index]
    try:
        lark.Lark(grammar, parser="earley").parse(text)
    except lark.LarkError:
        return False
    return True


def user(text: str) -> dict[str, object]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def request(items: list[dict[str, object]]) -> dict[str, object]:
    return {"model": "smol", "instructions": INSTRUCTIONS, "input": items,
            "tools": [SHELL, APPLY_PATCH], "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning": None, "store": False, "stream": True, "include": [],
            "prompt_cache_key": str(uuid.uuid4()),
            # not Codex's: keeps a small model's turns short and repeatable
            "max_output_tokens": 80, "temperature": 0}


TURN_1 = [user(ENVIRONMENT), user("List the files here.")]
TURN_2 = TURN_1 + [
    {"type": "function_call", "call_id": "call_shell_1", "name": "shell",
     "arguments": json.dumps({"command": ["bash", "-lc", "ls"], "workdir": "/home/user/project"})},
    {"type": "function_call_output", "call_id": "call_shell_1",
     "output": json.dumps({"output": "README.md\nsrc\n", "metadata": {"exit_code": 0}})}]
TURN_3 = TURN_2 + [
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": None,
     "encrypted_content": None},
    {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "There is a README.md and a src folder."}]},
    user("Add a file hello.txt saying hi."),
    {"type": "custom_tool_call", "call_id": "call_patch_1", "name": "apply_patch",
     "input": "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"},
    {"type": "custom_tool_call_output", "call_id": "call_patch_1",
     "output": "Success. Updated the following files:\nA hello.txt\n"}]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [{"model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 4096}]})
    srv = Server(config).start()
    yield srv
    srv.stop()


def frames(server: Server, body: dict[str, object]) -> list[tuple[str, dict[str, object]]]:
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for block in text.split("\n\n"):
        if not block:
            continue
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        out.append((event_line[len("event: "):], json.loads(data_line[len("data: "):])))
    return out


@pytest.mark.parametrize("items", [TURN_1, TURN_2, TURN_3], ids=["ask", "shell", "patch"])
def test_every_codex_turn_gets_a_well_formed_stream(server, items):
    events = frames(server, request(items))
    assert [name for name, _ in events] == [data["type"] for _, data in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    for _, data in events:
        EVENT.validate_python(data)  # openai-python's own event types, validated
    kinds = [data["type"] for _, data in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1][1]["response"]
    assert isinstance(final, dict) and final["store"] is False
    done = [data["item"] for _, data in events if data["type"] == "response.output_item.done"]
    added = [data["item"] for _, data in events if data["type"] == "response.output_item.added"]
    assert final["output"] == done and len(added) == len(done) >= 1
    assert [item["id"] for item in added] == [item["id"] for item in done]  # type: ignore[index]
    usage = final["usage"]
    assert isinstance(usage, dict) and usage["input_tokens"] > 0
    for item in done:
        assert isinstance(item, dict)
        if item["type"] == "function_call":
            assert item["name"] == "shell"
            assert isinstance(json.loads(item["arguments"]), dict)
        elif item["type"] == "custom_tool_call":
            # under auto too: the input follows Codex's grammar exactly
            assert item["name"] == "apply_patch" and is_patch(item["input"]), item["input"]
        else:
            assert item["type"] == "message"


def test_the_history_reaches_the_prompt(server):
    """Each turn's prompt holds the one before it (no item dropped): counted by input_tokens."""
    counts = []
    for items in (TURN_1, TURN_2, TURN_3):
        body = {k: v for k, v in request(items).items()
                if k in ("model", "instructions", "input", "tools", "tool_choice",
                         "parallel_tool_calls", "reasoning")}
        r = httpx.post(server.url + "/v1/responses/input_tokens", json=body, timeout=60)
        assert r.status_code == 200, r.text
        counts.append(r.json()["input_tokens"])
    assert counts[0] < counts[1] < counts[2]
