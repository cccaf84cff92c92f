"""Which model an Anthropic request gets: an alias (exact or glob), else the API's own default
model (`default_models.anthropic`), which other APIs do not share."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import ConfigError, load_config
from tests.support.ggufgen import write_tiny_llama
from tests.support.servers import ThreadedServer


def config_file(folder: Path, text: str) -> Path:
    path = folder / "modelyard.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("routing")
    write_tiny_llama(d / "a.gguf", seed=1)
    write_tiny_llama(d / "b.gguf", seed=2)
    config = load_config(config_file(d, """
        default_models: {anthropic: b}
        models:
          - model: a.gguf
            aliases: [a]
            n_ctx: 128
          - model: b.gguf
            aliases: [b]
            n_ctx: 128
    """))
    srv = ThreadedServer(create_app(config))
    srv.start_serving()
    yield srv
    srv.stop()


def message(server: Any, model: str | None) -> httpx.Response:
    body: dict[str, Any] = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    if model is not None:
        body["model"] = model
    return httpx.post(server.url + "/v1/messages", json=body, timeout=30)


def test_a_name_nobody_serves_gets_the_apis_default_model(server: Any) -> None:
    r = message(server, "claude-sonnet-4-6")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "b"
    assert message(server, None).json()["model"] == "b"


def test_a_name_an_entry_answers_to_is_served_by_it(server: Any) -> None:
    assert message(server, "a").json()["model"] == "a"


def test_other_apis_keep_their_404_and_their_default(server: Any) -> None:
    chat = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.url + "/v1/chat/completions", json={**chat, "model": "claude-x"})
    assert r.status_code == 404
    assert httpx.post(server.url + "/v1/chat/completions", json=chat).json()["model"] == "a"


def test_count_tokens_follows_the_same_default(server: Any) -> None:
    r = httpx.post(server.url + "/v1/messages/count_tokens", json={
        "model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_a_default_model_must_be_a_model_files_alias(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "a.gguf")
    with pytest.raises(ConfigError) as info:
        load_config(config_file(tmp_path, """
            default_models: {anthropic: nope}
            models:
              - model: a.gguf
                aliases: [a]
        """))
    assert "default_models.anthropic" in str(info.value)
    with pytest.raises(ConfigError) as unknown:
        load_config(config_file(tmp_path, """
            default_models: {gopher: a}
            models:
              - model: a.gguf
                aliases: [a]
        """))
    assert "default_models" in str(unknown.value)
