"""`modelyard serve` refuses to open the admin routes to a network: a non-loopback bind with no
key configured exits 2 with a message saying what to set, before it listens."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.config.exposure import is_loopback
from tests.support.ggufgen import write_tiny_llama


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False),
    ("example.com", False)])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _config(tmp_path: Path, auth: dict | None) -> Path:
    model = write_tiny_llama(tmp_path / "m.gguf", seed=1)
    body: dict = {"models": [{"model": str(model), "aliases": ["m"]}]}
    if auth is not None:
        body["auth"] = auth
    path = tmp_path / "modelyard.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_an_exposed_bind_without_any_key_is_refused(tmp_path: Path, capsys) -> None:
    config = _config(tmp_path, None)
    assert main(["serve", "--config", str(config), "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "0.0.0.0" in err and "auth.admin_key" in err and "127.0.0.1" in err


@pytest.mark.parametrize("auth", [{"admin_key": "sekrit-admin"},
                                  {"keys": [{"name": "app", "key": "sekrit-app"}]}])
def test_an_exposed_bind_with_a_key_passes_the_check(tmp_path: Path, auth: dict) -> None:
    from gateway.config import load_config
    from gateway.config.exposure import open_admin_problem

    assert open_admin_problem(load_config(_config(tmp_path, auth)), "0.0.0.0") is None
    assert open_admin_problem(load_config(_config(tmp_path, None)), "127.0.0.1") is None


# ------------------------------------------ no config on an exposed address: admin closed

def test_files_or_a_folder_on_an_exposed_bind_serve_with_the_admin_routes_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The container's mode (serve --models-dir /models --host 0.0.0.0): no key exists to
    guard the admin routes, so they close and the server starts, rather than refusing."""
    from gateway import cli

    seen: list = []

    async def fake_serve(config, socks, config_path, watch, load) -> None:
        for sock in socks:
            sock.close()
        seen.append((config, load))

    monkeypatch.setattr(cli, "_serve", fake_serve)
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "m.gguf", seed=1)
    assert main(["serve", "--models-dir", str(tmp_path / "models"), "--host", "0.0.0.0",
                 "--port", "0"]) == 0
    config, load = seen[0]
    assert config.auth.admin_closed and not config.auth.enabled
    assert load(tmp_path / "models").auth.admin_closed  # a rescan keeps them closed
    assert main(["serve", "--models-dir", str(tmp_path / "models"), "--port", "0"]) == 0
    assert not seen[1][0].auth.admin_closed  # on loopback they stay open, as before


def test_closed_admin_routes_answer_403_and_the_api_stays_open(tmp_path: Path, apps) -> None:
    from gateway.config import load_config
    from gateway.config.exposure import close_admin_if_exposed

    config = close_admin_if_exposed(load_config(_config(tmp_path, None)), "0.0.0.0")
    client = apps.client(config)
    for method, path in [("GET", "/admin/models"), ("POST", "/admin/reload"),
                         ("POST", "/models/load"), ("GET", "/admin/status")]:
        r = client.request(method, path, json={"model": "m"})
        assert r.status_code == 403, path
        assert "admin routes are closed" in r.json()["error"]["message"]
    assert client.get("/v1/models").status_code == 200
    r = client.post("/v1/chat/completions", json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
