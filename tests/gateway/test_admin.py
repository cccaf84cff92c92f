"""Admin and health endpoints on the real app (Starlette's TestClient runs its lifespan), with a
fake loader: models load instantly and report a queue, so every field can be checked."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from gateway.config import Config, ModelEntry
from gateway.state import app_state
from tests.support.apps import Apps
from tests.support.fakes import MB, Loader
from tests.support.ggufgen import write_servable


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def loader() -> Loader:
    return Loader()


@pytest.fixture
def client(apps: Apps, config_path: Path, loader: Loader) -> TestClient:
    return apps.client(config_path, loader=loader)


def rows(client: TestClient) -> dict[str, dict[str, Any]]:
    r = client.get("/admin/models")
    assert r.status_code == 200 and r.json()["object"] == "list"
    return {row["aliases"][0]: row for row in r.json()["data"]}


# ------------------------------------------------------------------------------------ health

def test_health_is_200_while_serving_and_503_once_stopping(client: TestClient) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    app_state(client.app).stopping = True  # what the CLI sets on SIGINT/SIGTERM
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "stopping"
    # llama.cpp's clients read its 503 shape: {"error": {"code": 503, ..., "type": "unavailable_error"}}
    assert r.json()["error"]["code"] == 503 and r.json()["error"]["type"] == "unavailable_error"
    assert r.headers["retry-after"] == "5"
    assert client.get("/admin/status").json()["status"] == "stopping"


def test_health_is_503_once_the_registry_closes(client: TestClient) -> None:
    client.portal.call(app_state(client.app).registry.close)
    assert client.get("/health").status_code == 503


# ------------------------------------------------------------------------------------ models

def test_models_lists_every_entry_with_its_numbers(client: TestClient, config_path: Path) -> None:
    before = time.time()
    listed = rows(client)
    assert list(listed) == ["a", "b"]
    a = listed["a"]
    assert a["aliases"] == ["a", "org/a"] and a["model"] == str(config_path.parent / "a.gguf")
    assert (a["state"], a["memory_bytes"], a["in_flight"], a["queued"]) == ("unloaded", 0, 0, 0)
    assert (a["load_count"], a["load_seconds"], a["last_used"], a["last_error"]) == \
        (0, None, None, None)
    assert a["n_ctx"] == 512 and a["pinned"] is False

    r = client.post("/admin/models/a/load")
    assert r.status_code == 200
    loaded = r.json()
    assert (loaded["state"], loaded["memory_bytes"], loaded["load_count"]) == ("ready", 3 * MB, 1)
    assert loaded["load_seconds"] >= 0 and before <= loaded["last_used"] <= time.time()
    assert rows(client)["b"]["state"] == "unloaded"  # only the one asked for


def test_queued_and_active_counts_come_from_the_served_model(client: TestClient,
                                                             loader: Loader) -> None:
    client.post("/admin/models/b/load")
    loader.loaded[0].queued = 7
    loader.loaded[0].active = 3
    row = rows(client)["b"]
    assert (row["queued"], row["active"]) == (7, 3)


def test_load_twice_loads_once_and_aliases_with_a_slash_work(client: TestClient,
                                                             loader: Loader) -> None:
    assert client.post("/admin/models/org/a/load").json()["load_count"] == 1
    assert client.post("/admin/models/a/load").json()["load_count"] == 1
    assert len(loader.loaded) == 1


def test_unload_drains_first(client: TestClient, loader: Loader) -> None:
    registry = app_state(client.app).registry
    client.post("/admin/models/a/load")
    lease = client.portal.call(registry.acquire, "a")  # type: ignore[union-attr]

    r = client.post("/admin/models/a/unload", params={"timeout": "0.05"})
    assert r.status_code == 202 and r.json()["state"] == "draining"
    assert r.json()["in_flight"] == 1 and not loader.loaded[0].closed

    client.portal.call(_release, registry, lease)  # type: ignore[union-attr]
    r = client.post("/admin/models/a/unload")
    assert r.status_code == 200 and r.json()["state"] == "unloaded"
    assert r.json()["memory_bytes"] == 0 and loader.loaded[0].closed
    assert client.post("/admin/models/a/unload").status_code == 200  # already unloaded: fine


async def _release(registry: Any, lease: Any) -> None:
    registry.release(lease)


def test_unknown_alias_and_bad_timeout_are_errors(client: TestClient) -> None:
    for path in ("/admin/models/nope/load", "/admin/models/nope/unload"):
        r = client.post(path)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "model_not_found" and "a, org/a, b" in \
            r.json()["error"]["message"]
    for bad in ("soon", "-1", "inf", "nan"):
        r = client.post("/admin/models/a/unload", params={"timeout": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "timeout"
    assert client.get("/admin/models/a/load").status_code == 405


# ------------------------------------------------------------------------------------ reload

def test_reload_applies_the_file_and_status_shows_it(client: TestClient,
                                                     config_path: Path) -> None:
    status = client.get("/admin/status").json()
    assert status["config"] == str(config_path) and status["last_reload"] is None
    assert status["watch"] == {"enabled": False, "polling": False, "paths": []}
    assert status["models"] == {"configured": 2, "loaded": 0, "aliases": ["a", "org/a", "b"]}
    client.post("/admin/models/a/load")

    write(config_path, {"models": [{"model": "a.gguf", "aliases": ["a", "a2"], "n_ctx": 512}]})
    r = client.post("/admin/reload")
    assert r.status_code == 200
    record = r.json()
    assert record["ok"] and record["trigger"] == "admin" and record["errors"] == []
    assert (record["kept"], record["reloaded"], record["added"], record["removed"]) == \
        (["a"], [], [], ["b"])
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["a", "a2"]
    assert rows(client)["a"]["load_count"] == 1  # kept warm

    status = client.get("/admin/status").json()
    assert status["last_reload"] == record and status["reloads"] == {"ok": 1, "error": 0}
    assert status["models"]["loaded"] == 1


def test_a_broken_file_keeps_the_running_config_and_status_shows_why(
        client: TestClient, config_path: Path) -> None:
    config_path.write_text("models:\n  - model: a.gguf\n    aliases: [a]\n    n_ctx: lots\n")
    r = client.post("/admin/reload")
    assert r.status_code == 422 and not r.json()["ok"]
    [error] = r.json()["errors"]
    assert error.startswith(f"{config_path}:4: models.0.n_ctx:")

    status = client.get("/admin/status").json()
    assert status["last_reload"]["ok"] is False and status["last_reload"]["errors"] == [error]
    assert status["reloads"] == {"ok": 0, "error": 1}
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["a", "org/a", "b"]
    assert client.post("/admin/models/b/load").status_code == 200


def test_a_config_built_in_code_cannot_be_reloaded(apps: Apps, tmp_path: Path,
                                                   loader: Loader) -> None:
    write_servable(tmp_path / "a.gguf")
    config = Config(models=[ModelEntry(model=tmp_path / "a.gguf", aliases=["a"])])
    client = apps.client(config, loader=loader)
    r = client.post("/admin/reload")
    assert r.status_code == 422 and "no config file" in r.json()["errors"][0]
    assert client.get("/admin/status").json()["config"] is None
