"""Reasoning controls against tiny models with thinking templates: each does what it says.

Three entries over one tiny file: "opens" lets the model open <think> (its template writes an
empty block when thinking is off and names reasoning_effort), "prompted" opens the block in the
prompt (as Qwen3-Thinking-2507), "budgeted" is "prompted" with entry defaults (a budget of 2,
the `reasoning` field). A random model writes no tags of its own, so a GBNF grammar makes it
write the block; greedy decoding then gives the same tokens until a control intervenes, so the
unconstrained run is the expectation for the controlled one. Prompts are compared with plain
jinja2's rendering, tokenized by the server's /tokenize.
"""
from __future__ import annotations

import json
from typing import Any

import httpx
import jinja2
import jsonschema
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.support.ggufgen import write_tiny_llama
from tests.support.servers import ThreadedServer, write_config

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")
OPENS = (CHATML + "{% if reasoning_effort is defined %}{{ 'effort ' + reasoning_effort }}"
         "{% endif %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
         "{% if enable_thinking is defined and not enable_thinking %}"
         "{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}")
PROMPTED = (CHATML + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
            "{% if enable_thinking is defined and not enable_thinking %}"
            "{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}")
MESSAGES = [{"role": "user", "content": "What is two plus two?"}]
MODEL_OPENS = 'root ::= "<think>" [a-z]{1,10} "</think>" [a-z]*'
PROMPT_OPENED = 'root ::= [a-z]{1,8} "</think>" [a-z]*'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("reasoning")
    # room for a tool's description (the generic format explains itself in a system note)
    model = str(write_tiny_llama(d / "tiny.gguf", chat_template=OPENS, n_ctx_train=1024))
    entry = {"model": model, "n_ctx": 1024, "n_parallel": 1, "temperature": 0.0}
    config = write_config(d / "modelyard.yaml", {"models": [
        {**entry, "aliases": ["opens"]},
        {**entry, "aliases": ["prompted"], "chat_template": PROMPTED},
        {**entry, "aliases": ["budgeted"], "chat_template": PROMPTED, "reasoning_budget": 2,
         "reasoning_field": True},
    ]})
    srv = ThreadedServer(create_app(load_config(config)))
    srv.start_serving()
    yield srv
    srv.stop()


def prompt_tokens(server: Any, template: str, **variables: Any) -> int:
    text = jinja2.Environment().from_string(template).render(
        messages=MESSAGES, add_generation_prompt=True, **variables)
    r = httpx.post(server.url + "/tokenize", json={
        "model": "opens", "content": text, "add_special": True, "parse_special": True})
    return len(r.json()["tokens"])


def chat(server: Any, model: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": model, "messages": MESSAGES, "max_tokens": 24, **body})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def token_texts(reply: dict[str, Any]) -> list[str]:
    return [t["token"] for t in reply["choices"][0]["logprobs"]["content"]]


# --------------------------------------------------------------------------------- the prompt

@pytest.mark.parametrize(("body", "variables"), [
    ({"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False}),
    ({"reasoning_effort": "none"}, {"enable_thinking": False}),
    ({"reasoning_budget": 0}, {"enable_thinking": False}),
    ({"reasoning_effort": "high"}, {"reasoning_effort": "high"}),
    ({}, {}),
])
def test_chat_controls_reach_the_template(server: Any, body: dict[str, Any],
                                          variables: dict[str, Any]) -> None:
    reply = chat(server, "opens", max_tokens=1, **body)
    assert reply["usage"]["prompt_tokens"] == prompt_tokens(server, OPENS, **variables)


def test_ollama_think_false_and_levels_are_honoured(server: Any) -> None:
    for think, variables in ((False, {"enable_thinking": False}),
                             ("high", {"enable_thinking": True, "reasoning_effort": "high"})):
        r = httpx.post(server.url + "/api/chat", timeout=60, json={
            "model": "opens", "messages": MESSAGES, "think": think, "stream": False,
            "options": {"num_predict": 1}})
        assert r.status_code == 200, r.text
        assert r.json()["prompt_eval_count"] == prompt_tokens(server, OPENS, **variables)


def test_responses_effort_none_turns_thinking_off(server: Any) -> None:
    r = httpx.post(server.url + "/v1/responses/input_tokens", timeout=60, json={
        "model": "opens", "input": MESSAGES[0]["content"], "reasoning": {"effort": "none"}})
    assert r.status_code == 200, r.text
    expected = prompt_tokens(server, OPENS, enable_thinking=False)
    assert r.json()["input_tokens"] == expected


# --------------------------------------------------------------------------------- the reply

def thinking_tokens(texts: list[str], opened: bool) -> list[str]:
    """The tokens of the block: after the one completing <think> (unless the prompt opened
    it), up to the one starting </think>."""
    start = 0
    if not opened:
        start = next(i for i in range(1, len(texts) + 1) if "<think>" in "".join(texts[:i]))
    inner = []
    for piece in texts[start:]:
        if piece.startswith("<"):
            break
        inner.append(piece)
    return inner


def test_a_block_the_model_opens_is_read_and_its_budget_kept(server: Any) -> None:
    free = chat(server, "opens", grammar=MODEL_OPENS, logprobs=True)
    free_thinking = thinking_tokens(token_texts(free), opened=False)
    assert len(free_thinking) > 3, "the tiny model should think for longer than the budget"
    assert free["choices"][0]["message"]["reasoning_content"] == "".join(free_thinking).strip()
    short = chat(server, "opens", grammar=MODEL_OPENS, logprobs=True, reasoning_budget=3)
    message = short["choices"][0]["message"]
    assert message["reasoning_content"] == "".join(free_thinking[:3]).strip()
    assert "</think>" not in message["content"] and "<think>" not in message["content"]


def test_thinking_off_closes_a_block_the_template_cannot_switch_off(server: Any) -> None:
    # "opens" writes an empty block into the prompt when thinking is off, but the model (made
    # to by the grammar) opens one anyway: thinking off is a budget of 0, which closes it at once
    reply = chat(server, "opens", grammar='root ::= "<think>" [a-z]{0,10} "</think>" [a-z]+',
                 chat_template_kwargs={"enable_thinking": False})
    message = reply["choices"][0]["message"]
    assert "reasoning_content" not in message and "think>" not in message["content"]


def test_a_block_the_prompt_opened_is_read_from_the_first_token(server: Any) -> None:
    raw = chat(server, "prompted", grammar=PROMPT_OPENED, reasoning_format="none")
    as_written = raw["choices"][0]["message"]["content"]
    assert "reasoning_content" not in raw["choices"][0]["message"] and "</think>" in as_written
    thought, answer = as_written.split("</think>")
    read = chat(server, "prompted", grammar=PROMPT_OPENED)["choices"][0]["message"]
    assert (read["reasoning_content"], read["content"]) == (thought.strip(), answer.strip())
    legacy = chat(server, "prompted", grammar=PROMPT_OPENED,
                  reasoning_format="deepseek-legacy")["choices"][0]["message"]
    assert legacy["reasoning_content"] == thought.strip()
    assert legacy["content"] == "<think>" + as_written
    assert "reasoning" not in read  # only where the entry asks for it


def test_entry_defaults_budget_and_the_reasoning_field(server: Any) -> None:
    free = chat(server, "prompted", grammar=PROMPT_OPENED, logprobs=True)
    free_thinking = thinking_tokens(token_texts(free), opened=True)
    assert len(free_thinking) > 2
    message = chat(server, "budgeted", grammar=PROMPT_OPENED)["choices"][0]["message"]
    assert message["reasoning_content"] == "".join(free_thinking[:2]).strip()
    assert message["reasoning"] == message["reasoning_content"]
    unlimited = chat(server, "budgeted", grammar=PROMPT_OPENED, reasoning_budget=-1)
    assert (unlimited["choices"][0]["message"]["reasoning_content"]
            == free["choices"][0]["message"]["reasoning_content"])


def test_streamed_deltas_carry_both_fields_and_add_up(server: Any) -> None:
    whole = chat(server, "budgeted", grammar=PROMPT_OPENED)["choices"][0]["message"]
    reasoning, also, content = "", "", ""
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "model": "budgeted", "messages": MESSAGES, "max_tokens": 24, "stream": True,
            "grammar": PROMPT_OPENED}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            reasoning += delta.get("reasoning_content", "")
            also += delta.get("reasoning", "")
            content += delta.get("content", "")
    assert (reasoning, also, content) == (whole["reasoning_content"], whole["reasoning"],
                                          whole["content"])


# --------------------------------------------------------------------------------- after the block
# "budgeted" opens the block in the prompt and closes it after 2 tokens: a schema or a tool's
# grammar must take over only then. The expectation for the block is the same request with
# nothing to follow (greedy: the same 2 free tokens; this tiny model's are blank, so the
# reasoning reads empty); for the rest, the schema itself. A grammar applied from the first
# token would write JSON into the block, and the closing tag the budget forces would end it.

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
LOOKUP = {"name": "lookup", "description": "Look a number up", "parameters": SCHEMA}


@pytest.fixture(scope="module")
def free_block(server: Any) -> list[str]:
    """The free run's tokens up to the closing tag's first one (the 2 the budget allows)."""
    texts = token_texts(chat(server, "budgeted", logprobs=True))
    return texts[:2]


def test_chat_json_schema_applies_after_the_block_the_prompt_opened(
        server: Any, free_block: list[str]) -> None:
    reply = chat(server, "budgeted", max_tokens=60, logprobs=True, response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}})
    assert token_texts(reply)[:2] == free_block
    message = reply["choices"][0]["message"]
    assert message.get("reasoning_content", "") == "".join(free_block).strip()
    jsonschema.validate(json.loads(message["content"]), SCHEMA)


def test_chat_tool_grammar_applies_after_the_block_the_prompt_opened(
        server: Any, free_block: list[str]) -> None:
    reply = chat(server, "budgeted", max_tokens=200, logprobs=True, tool_choice="required",
                 tools=[{"type": "function", "function": LOOKUP}])
    assert token_texts(reply)[:2] == free_block
    [call] = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)


def test_responses_text_format_applies_after_the_block(server: Any,
                                                       free_block: list[str]) -> None:
    r = httpx.post(server.url + "/v1/responses", timeout=60, json={
        "model": "budgeted", "input": MESSAGES[0]["content"], "max_output_tokens": 60,
        "text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "completed"
    reasoning = [i["content"][0]["text"] for i in body["output"] if i["type"] == "reasoning"]
    assert "".join(reasoning) == "".join(free_block).strip()
    [message] = [i for i in body["output"] if i["type"] == "message"]
    jsonschema.validate(json.loads(message["content"][0]["text"]), SCHEMA)


def test_ollama_format_applies_after_the_block(server: Any, free_block: list[str]) -> None:
    # the entry's reasoning defaults (this budget) reach /api/chat as every other route
    r = httpx.post(server.url + "/api/chat", timeout=60, json={
        "model": "budgeted", "messages": MESSAGES, "format": SCHEMA, "stream": False,
        "think": True, "options": {"num_predict": 60}})
    assert r.status_code == 200, r.text
    assert r.json()["done_reason"] == "stop"
    message = r.json()["message"]
    assert (message.get("thinking") or "") == "".join(free_block).strip()
    jsonschema.validate(json.loads(message["content"]), SCHEMA)


def test_anthropic_tool_use_applies_after_the_block(server: Any, free_block: list[str]) -> None:
    r = httpx.post(server.url + "/v1/messages", timeout=60, json={
        "model": "budgeted", "max_tokens": 200, "messages": MESSAGES,
        "tool_choice": {"type": "any"},
        "tools": [{"name": "lookup", "description": LOOKUP["description"],
                   "input_schema": SCHEMA}]})
    assert r.status_code == 200, r.text
    blocks = r.json()["content"]
    thinking = [b["thinking"] for b in blocks if b["type"] == "thinking"]
    assert "".join(thinking) == "".join(free_block).strip()
    [use] = [b for b in blocks if b["type"] == "tool_use"]
    assert use["name"] == "lookup" and r.json()["stop_reason"] == "tool_use"
    jsonschema.validate(use["input"], SCHEMA)
