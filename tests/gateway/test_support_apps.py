"""tests/support/apps.py, the one way the gateway tests get an app: every form of config gives
the same gateway, and close() shuts down all it opened, even when one of them fails to."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from gateway.config import Config, ModelEntry
from tests.support.apps import Apps
from tests.support.fakes import Loader
from tests.support.ggufgen import write_servable

MODELS = {"models": [{"model": "a.gguf", "aliases": ["a", "org/a"]},
                     {"model": "b.gguf", "aliases": ["b"]}]}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        write_servable(tmp_path / f"{name}.gguf")
    return tmp_path


def _listed(apps: Apps, config: object) -> list[tuple[str, str]]:
    client = apps.client(config, loader=Loader())  # type: ignore[arg-type]
    rows = client.get("/admin/models").json()["data"]
    return [(row["aliases"][0], row["model"]) for row in rows]


def test_a_dict_text_path_or_config_gives_the_same_gateway(folder: Path) -> None:
    apps = Apps(folder)
    try:
        path = folder / "mine.yaml"
        path.write_text(yaml.safe_dump(MODELS))
        expected = [("a", str(folder / "a.gguf")), ("b", str(folder / "b.gguf"))]
        config = Config(models=[ModelEntry(model=folder / "a.gguf", aliases=["a"]),
                                ModelEntry(model=folder / "b.gguf", aliases=["b"])])
        for given in (MODELS, yaml.safe_dump(MODELS), path, config):
            assert _listed(apps, given) == expected, given  # relative paths: against the folder
        # text and dicts each got a file of their own; the test's own file was left alone
        assert sorted(p.name for p in folder.glob("*.yaml")) == [
            "mine.yaml", "modelyard-1.yaml", "modelyard.yaml"]
        assert yaml.safe_load(path.read_text()) == MODELS
    finally:
        apps.close()


def test_close_shuts_down_clients_and_servers_it_opened(folder: Path) -> None:
    apps, loader = Apps(folder), Loader()
    client = apps.client(MODELS, loader=loader)
    server = apps.serve(MODELS, loader=loader)
    assert client.post("/admin/models/a/load").status_code == 200
    assert httpx.post(server.url + "/admin/models/b/load").status_code == 200
    assert [m.closed for m in loader.loaded] == [False, False]
    apps.close()
    assert [m.closed for m in loader.loaded] == [True, True]  # each lifespan ran its shutdown
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


def test_close_goes_on_past_a_failure_and_raises_it(folder: Path) -> None:
    apps, loader = Apps(folder), Loader()
    apps.client(MODELS, loader=loader).post("/admin/models/a/load")
    broken = apps.serve(MODELS, loader=loader)
    broken.stop()  # stopping it again in close() fails: its loop is gone
    with pytest.raises(RuntimeError, match="closed"):
        apps.close()
    assert loader.loaded[0].closed  # the client opened before it was still closed
