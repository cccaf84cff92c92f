"""Ollama's wire without SmolLM2: NDJSON framing, its error shape on every refusal (the keys'
too), name resolution, and how its messages and options become OpenAI's request."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from gateway.api.ollama import (
    PREFIX,  # importing the routes registers the error shape
    resolve_name,
)
from gateway.api.ollama_wire import _messages, _sampling, ollama_body, ollama_name
from gateway.app import create_app
from gateway.config import load_config
from gateway.errors import APIError, openai_shape, shape_for
from gateway.http.streaming import NDJSON, sse_body
from gateway.protocol import RequestValidationError
from gateway.protocol import ollama as o
from tests.support.ggufgen import write_tiny_llama


async def _chunks(fail: bool) -> Any:
    yield {"message": {"content": "a\u2028b"}, "done": False}
    if fail:
        raise APIError(503, "busy")
    yield {"done": True}


def _encoded(fail: bool) -> list[bytes]:
    async def run() -> list[bytes]:
        return [b async for b in sse_body(_chunks(fail), ollama_body, NDJSON)]
    return asyncio.run(run())


def test_ndjson_is_one_object_per_line_without_an_end_marker():
    out = _encoded(fail=False)
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in out)
    assert [json.loads(line) for line in out] == [
        {"message": {"content": "a\u2028b"}, "done": False}, {"done": True}]
    assert b"\xe2\x80\xa8" not in b"".join(out)  # escaped: str.splitlines would cut it


def test_a_failed_ndjson_stream_ends_with_an_error_line():
    out = _encoded(fail=True)
    assert json.loads(out[-1]) == {"error": "busy"} and len(out) == 2


def test_error_shape_follows_the_path():
    err = APIError(404, "no such model")
    assert PREFIX == "/api/"
    assert shape_for("/api/chat")(err) == (404, {"error": "no such model"})
    assert shape_for("/v1/chat/completions") is openai_shape
    assert shape_for("/apiary") is openai_shape


def test_names_with_the_default_tag():
    config: Any = Aliases(["a", "b:latest"])
    assert resolve_name(config, "a:latest") == "a"
    assert resolve_name(config, "b:latest") == "b:latest"  # an alias that says so wins
    assert resolve_name(config, "a:q4") == "a:q4"          # other tags are names of their own
    assert ollama_name("a") == "a:latest" and ollama_name("b:latest") == "b:latest"


class Aliases:
    """What resolve_name reads of a Config."""

    def __init__(self, aliases: list[str]) -> None:
        self._aliases = aliases

    def aliases(self) -> list[str]:
        return self._aliases


def test_tool_results_answer_the_call_of_their_tool():
    req = o.ChatRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "weather and time?"},
        {"role": "assistant", "tool_calls": [
            {"function": {"name": "weather", "arguments": {"city": "Oslo"}}},
            {"function": {"name": "time", "arguments": {}}}]},
        {"role": "tool", "tool_name": "time", "content": "12:00"},
        {"role": "tool", "content": "rain"}]})
    messages = _messages(req)
    calls = messages[1]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Oslo"}, {}]
    assert messages[2]["tool_call_id"] == calls[1]["id"]   # by tool_name
    assert messages[3]["tool_call_id"] == calls[0]["id"]   # the one left


def test_options_become_sampling_fields_and_num_ctx_must_match():
    options = o.Options.model_validate({"num_predict": 7, "temperature": 0, "top_k": 5,
                                        "stop": ["\n"], "num_gpu": 1, "num_ctx": 512})
    assert _sampling(options, 512) == {"temperature": 0, "top_k": 5, "max_tokens": 7,
                                       "stop": ["\n"]}
    assert "max_tokens" not in _sampling(o.Options(num_predict=-1), 512)
    with pytest.raises(APIError, match="num_ctx"):
        _sampling(options, 1024)
    with pytest.raises(APIError, match="mirostat"):
        _sampling(o.Options(mirostat=2), 512)


def test_a_bad_field_is_a_400_naming_it():
    from gateway.protocol import parse_request

    with pytest.raises(RequestValidationError) as e:
        parse_request(o.ChatRequest, b'{"model": "m", "messages": [{"role": "robot"}]}')
    assert e.value.param == "messages[0].role"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("ollama")
    a, b = write_tiny_llama(d / "a.gguf", seed=1), write_tiny_llama(d / "b.gguf", seed=2)
    config = d / "modelyard.yaml"
    config.write_text(yaml.safe_dump({
        "auth": {"keys": [{"name": "bob", "key": "bob-key-123456", "models": ["a"]}]},
        "models": [{"model": str(a), "aliases": ["a"], "n_ctx": 128},
                   {"model": str(b), "aliases": ["b"], "n_ctx": 128}]}))
    with TestClient(create_app(load_config(Path(config)))) as client:
        yield client


def test_keys_and_per_key_models_cover_the_ollama_routes(keyed):
    no_key = keyed.post("/api/chat", json={"model": "a", "messages": []})
    assert no_key.status_code == 401 and isinstance(no_key.json()["error"], str)
    bob = {"Authorization": "Bearer bob-key-123456"}
    assert [m["model"] for m in keyed.get("/api/tags", headers=bob).json()["models"]] == \
        ["a:latest"]
    refused = keyed.post("/api/chat", headers=bob, json={"model": "b", "messages": [
        {"role": "user", "content": "hi"}], "stream": False})
    assert refused.status_code == 403 and "'b'" in refused.json()["error"]
    refused = keyed.post("/api/show", headers=bob, json={"model": "b:latest"})
    assert refused.status_code == 403
    ok = keyed.post("/api/generate", headers=bob, json={
        "model": "a:latest", "prompt": "hi", "stream": False, "options": {"num_predict": 3}})
    assert ok.status_code == 200 and ok.json()["done"] and ok.json()["eval_count"] <= 3


def test_nothing_to_embed_is_a_400_not_a_500(keyed):
    """What the fuzzing run found: an empty input list, or an empty text in it, reached the
    embedding request's own check and came back as a 500."""
    for body in ({"model": "a", "input": []}, {"model": "a", "input": ["hi", "", "there"]}):
        r = keyed.post("/api/embed", json=body, headers={"Authorization": "Bearer bob-key-123456"})
        assert r.status_code == 400 and "input" in r.json()["error"], r.text


def test_responses_input_tokens_refuses_a_bad_keep_alive(keyed):
    r = keyed.post("/v1/responses/input_tokens", headers={"Authorization": "Bearer bob-key-123456"},
                   json={"model": "a", "input": "hi", "keep_alive": "<\nc|\n"})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]["message"], r.text
