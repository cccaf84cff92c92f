"""`thinking` reaches the chat template: enabled/disabled become its `enable_thinking`, which
templates such as Qwen3's read to open an empty think block (thinking off) or not.

A tiny model whose template branches on `enable_thinking`; the prompt Anthropic's
count_tokens counts must be the one plain jinja2 renders for that value, tokenized by the
server's /tokenize.
"""
from __future__ import annotations

from typing import Any

import httpx
import jinja2
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.support.ggufgen import write_tiny_llama
from tests.support.servers import ThreadedServer, write_config

TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("think")
    model = write_tiny_llama(d / "think.gguf", chat_template=TEMPLATE)
    config = write_config(d / "modelyard.yaml", {
        "models": [{"model": str(model), "aliases": ["think"], "n_ctx": 256}]})
    srv = ThreadedServer(create_app(load_config(config)))
    srv.start_serving()
    yield srv
    srv.stop()


def expected_tokens(server: Any, **variables: Any) -> int:
    text = jinja2.Environment().from_string(TEMPLATE).render(
        messages=MESSAGES, add_generation_prompt=True, **variables)
    r = httpx.post(server.url + "/tokenize", json={
        "model": "think", "content": text, "add_special": True, "parse_special": True})
    return len(r.json()["tokens"])


@pytest.mark.parametrize(("thinking", "variables"), [
    ({"type": "disabled"}, {"enable_thinking": False}),
    ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True}),
    (None, {}),
])
def test_thinking_reaches_the_template(server: Any, thinking: dict[str, Any] | None,
                                       variables: dict[str, Any]) -> None:
    body: dict[str, Any] = {"model": "think", "messages": MESSAGES}
    if thinking is not None:
        body["thinking"] = thinking
    r = httpx.post(server.url + "/v1/messages/count_tokens", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] == expected_tokens(server, **variables)


def test_thinking_off_costs_the_empty_think_block(server: Any) -> None:
    counts = {}
    for kind in ("enabled", "disabled"):
        thinking = {"type": kind, **({"budget_tokens": 1024} if kind == "enabled" else {})}
        r = httpx.post(server.url + "/v1/messages/count_tokens", timeout=30, json={
            "model": "think", "messages": MESSAGES, "thinking": thinking})
        counts[kind] = r.json()["input_tokens"]
    assert counts["disabled"] > counts["enabled"]


def test_a_message_with_thinking_disabled_is_served(server: Any) -> None:
    r = httpx.post(server.url + "/v1/messages", timeout=30, json={
        "model": "think", "max_tokens": 4, "messages": MESSAGES, "thinking": {"type": "disabled"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["type"] == "message" and body["usage"]["output_tokens"] >= 1
    assert body["usage"]["input_tokens"] == expected_tokens(server, enable_thinking=False)
