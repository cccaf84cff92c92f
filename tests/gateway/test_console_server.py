"""The console's server side, without a browser: the page from memory, and /admin/events.

The event stream is read from a real server (Hypercorn in a thread) with httpx, as the page
reads it; the models load through tests/support/fakes.py's instant fake loader.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.api import console
from tests.support.apps import Apps
from tests.support.fakes import Loader

STATIC = Path(console.__file__).with_name("static")


@pytest.fixture
def client(apps: Apps, config_path: Path) -> TestClient:
    return apps.client(config_path, loader=Loader())


# what Chromium and Firefox send for a page they navigate to
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,"
                     "image/webp,*/*;q=0.8"}


def test_the_page_is_served_at_root_and_ui_with_the_files_bytes(client: TestClient) -> None:
    page = (STATIC / "index.html").read_bytes()
    for path in ("/", "/ui/"):
        r = client.get(path, headers=BROWSER)
        assert r.status_code == 200 and r.content == page
        assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
    r = client.get("/ui/main.js")
    assert r.content == (STATIC / "main.js").read_bytes()
    assert r.headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize("accept", [None, "*/*", "application/json"])
def test_root_answers_ollama_clients_as_ollama_does(client: TestClient,
                                                    accept: str | None) -> None:
    # Ollama's server answers GET / and HEAD / with 200 "Ollama is running" (text/plain);
    # its CLI, ollama-python's users and Open WebUI probe it. curl sends */*, no Accept at all
    # is what a bare HTTP probe sends, ollama-python sends application/json
    headers = {"Accept": accept} if accept is not None else {}
    if accept is None:
        client.headers.pop("accept", None)
    r = client.get("/", headers=headers)
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert r.headers["content-type"].startswith("text/plain")
    assert r.headers["vary"] == "Accept"
    head = client.head("/", headers=headers)
    assert head.status_code == 200 and head.content == b""
    assert client.get("/", headers=BROWSER).headers["vary"] == "Accept"
    assert client.head("/", headers=BROWSER).headers["content-type"].startswith("text/html")


def test_every_file_the_page_names_is_served(client: TestClient) -> None:
    import re

    html = (STATIC / "index.html").read_text()
    named = re.findall(r'(?:href|src)="(/ui/[^"]+)"', html)
    for js in STATIC.glob("*.js"):  # ES module imports: "./api.js"
        named += ["/ui/" + m for m in re.findall(r'from "\./([^"]+)"', js.read_text())]
    assert "/ui/main.js" in named and "/ui/api.js" in named
    for path in set(named):
        assert client.get(path).status_code == 200, path


def test_an_unchanged_file_is_a_304_and_an_unknown_one_a_404(client: TestClient) -> None:
    etag = client.get("/ui/console.css").headers["etag"]
    r = client.get("/ui/console.css", headers={"If-None-Match": etag})
    assert r.status_code == 304 and r.content == b""
    assert client.get("/ui/nothing.js").status_code == 404
    assert client.get("/ui/../app.py").status_code == 404


def test_console_paths_are_the_page_and_its_files_only() -> None:
    assert all(console.is_console_path(p) for p in ("/", "/ui", "/ui/", "/ui/main.js"))
    assert not any(console.is_console_path(p) for p in ("/v1/models", "/admin/events", "/uix"))


def _events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    """(event, data) pairs of an SSE stream, parsed by the spec's rules (enough of them)."""
    name, data = "message", []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith(":") or line.startswith("retry:"):
            continue
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def test_events_send_models_and_status_then_every_change(apps: Apps, config_path: Path) -> None:
    server = apps.serve(config_path, loader=Loader())
    with httpx.stream("GET", server.url + "/admin/events", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
        first = dict(next(events) for _ in range(2))
        assert first["models"] == httpx.get(server.url + "/admin/models").json()["data"]
        status = httpx.get(server.url + "/admin/status").json()
        status.pop("uptime_seconds")
        assert first["status"] == status
        assert [row["state"] for row in first["models"]] == ["unloaded", "unloaded"]

        started = time.monotonic()
        assert httpx.post(server.url + "/admin/models/b/load").status_code == 200
        name, rows = next(events)
        while not (name == "models" and rows[1]["state"] == "ready"):
            name, rows = next(events)
        assert time.monotonic() - started < 5
        assert rows[1]["memory_bytes"] > 0 and rows[0]["state"] == "unloaded"

        httpx.post(server.url + "/admin/reload")
        name, data = next(events)
        while not (name == "status" and data["last_reload"]):  # "loaded" changed first
            name, data = next(events)
        assert data["last_reload"]["trigger"] == "admin" and data["last_reload"]["ok"]
