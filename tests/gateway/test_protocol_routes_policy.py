"""Keys, per-key models, metrics and the access log cover every route the protocols added
(Anthropic's, Responses', Ollama's): a request without a key is refused, a key's models are the
only ones it reaches, a served request is counted under its route template and alias, and the
access log has its line. Two tiny models; the key `bob` may use only `a`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import load_config
from tests.gateway.test_metrics import parse, value
from tests.support.ggufgen import write_tiny_llama

BOB = {"Authorization": "Bearer bob-key-123456"}
HI = [{"role": "user", "content": "hi"}]
ROUTES: list[tuple[str, dict[str, Any]]] = [  # path, body (without "model")
    ("/v1/messages", {"max_tokens": 2, "messages": HI}),
    ("/v1/messages/count_tokens", {"messages": HI}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
    ("/v1/responses/input_tokens", {"input": "hi"}),
    ("/api/chat", {"messages": HI, "stream": False, "options": {"num_predict": 2}}),
    ("/api/generate", {"prompt": "hi", "stream": False, "options": {"num_predict": 2}}),
    ("/api/embed", {"input": "hi"}),
    ("/api/show", {}),
]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    d = tmp_path_factory.mktemp("routes")
    a, b = write_tiny_llama(d / "a.gguf", seed=1), write_tiny_llama(d / "b.gguf", seed=2)
    config = d / "modelyard.yaml"
    config.write_text(yaml.safe_dump({
        "auth": {"keys": [{"name": "bob", "key": "bob-key-123456", "models": ["a"]}]},
        "models": [{"model": str(a), "aliases": ["a"], "n_ctx": 128},
                   {"model": str(b), "aliases": ["b"], "n_ctx": 128}]}))
    with TestClient(create_app(load_config(Path(config)))) as client:
        yield client


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[p for p, _ in ROUTES])
def test_every_protocol_route_takes_keys_and_per_key_models(keyed: TestClient, path: str,
                                                             body: dict[str, Any]) -> None:
    assert keyed.post(path, json={"model": "a", **body}).status_code == 401
    assert keyed.post(path, headers={"Authorization": "Bearer wrong-key-000000"},
                      json={"model": "a", **body}).status_code == 401
    refused = keyed.post(path, headers=BOB, json={"model": "b", **body})
    assert refused.status_code == 403 and "'b'" in refused.text
    assert keyed.post(path, headers=BOB, json={"model": "a", **body}).status_code == 200


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[p for p, _ in ROUTES])
def test_every_protocol_route_is_counted_and_logged(keyed: TestClient, path: str,
                                                    body: dict[str, Any],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    def served() -> float:
        samples = parse(keyed.get("/metrics").text)
        return value(samples, "modelyard_requests_total", model="a", status="200",
                     endpoint=path) or 0.0

    before = served()
    with caplog.at_level(logging.INFO, logger="modelyard.access"):
        assert keyed.post(path, headers=BOB, json={"model": "a", **body}).status_code == 200
    assert served() == before + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "modelyard.access"]
    assert any(f"POST {path} 200" in line and line.endswith(" a") for line in lines), lines
    assert not any("bob-key" in line for line in lines)  # the key never reaches the log
