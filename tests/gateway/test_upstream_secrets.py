"""An upstream that echoes the secrets it is sent and sets cookies, behind the gateway: no client
sees the key, wherever the upstream puts it, and no cookie of one client reaches another."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway.app import create_app
from gateway.backends.masking import MAX_FIELD, Masker
from gateway.config import load_config
from tests.support.servers import ThreadedServer

KEY = "sk-upstream-secret-0123456789abcdef"
TEAM_TOKEN = "team-token-9f8e7d6c5b4a"


class Echoing:
    """An OpenAI-compatible server that answers errors echoing the key it got, the way a test
    sets (`mode`), and sets a session cookie on every answer; it records the headers it got."""

    def __init__(self) -> None:
        self.mode = "fields"
        self.received: list[dict[str, str]] = []
        self.app = Starlette(routes=[Route("/v1/models", self.models),
                                     Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": []})

    async def chat(self, request: Request) -> Response:
        self.received.append(dict(request.headers))
        sent = request.headers.get("authorization", "").removeprefix("Bearer ")
        cookie = {"Set-Cookie": f"session=client-{len(self.received)}; Path=/"}
        if self.mode == "ok":
            return JSONResponse({"object": "chat.completion", "choices": []}, headers=cookie)
        if self.mode == "fields":   # the key in every field of OpenAI's error shape
            return JSONResponse({"error": {
                "message": f"bad key {sent}", "type": f"auth:{sent}", "param": sent,
                "code": f"{sent}/{request.headers.get('x-team-token')}"}},
                status_code=401, headers={**cookie, "Retry-After": sent})
        if self.mode == "text_at_cut":   # a plain-text body whose key straddles MAX_FIELD
            pad = "x" * (MAX_FIELD - 10 - len(" key="))
            return PlainTextResponse(f"{pad} key={sent} trailing", status_code=400,
                                     headers=cookie)
        # "json_at_cut": a JSON message whose key straddles MAX_FIELD
        pad = "y" * (MAX_FIELD - 12)
        return JSONResponse({"error": {"message": pad + sent + "z" * 100}}, status_code=400,
                            headers=cookie)


@pytest.fixture
def echoing() -> Iterator[tuple[Echoing, ThreadedServer]]:
    scripted = Echoing()
    server = ThreadedServer(scripted.app)
    server.start_serving()
    try:
        yield scripted, server
    finally:
        server.stop()


@pytest.fixture
def front(tmp_path: Path, echoing: tuple[Echoing, ThreadedServer]) -> Iterator[ThreadedServer]:
    _, upstream = echoing
    path = tmp_path / "front.yaml"
    path.write_text(yaml.safe_dump({"models": [{"aliases": ["chat"], "upstream": {
        "url": upstream.url, "api_key": KEY, "name": "gpu-a",
        "headers": {"X-Team-Token": TEAM_TOKEN}}}]}))
    server = ThreadedServer(create_app(load_config(path)))
    server.ready_path = "/health"
    server.start_serving()
    try:
        yield server
    finally:
        server.stop()


def _chat(url: str, client: httpx.Client | None = None) -> httpx.Response:
    post = client.post if client is not None else httpx.post
    return post(url + "/v1/chat/completions", timeout=10, json={
        "model": "chat", "messages": [{"role": "user", "content": "hi"}]})


def _leaks(text: str) -> list[str]:
    """The secrets, or their first 8 characters, that `text` shows."""
    return [s for s in (KEY, TEAM_TOKEN) if s[:8] in text]


def test_an_echoed_key_is_masked_in_every_field_and_header_of_the_error(
        front: ThreadedServer, echoing: tuple[Echoing, ThreadedServer]) -> None:
    r = _chat(front.url)
    assert r.status_code == 401
    error = r.json()["error"]
    assert error["message"] == "upstream gpu-a answered 401: bad key ***"
    assert (error["type"], error["param"], error["code"]) == ("auth:***", "***", "***/***")
    assert _leaks(r.text) == [] and _leaks(json.dumps(dict(r.headers))) == []


@pytest.mark.parametrize("mode", ["text_at_cut", "json_at_cut"])
def test_a_key_near_a_cut_leaves_none_of_its_characters(
        front: ThreadedServer, echoing: tuple[Echoing, ThreadedServer], mode: str) -> None:
    echoing[0].mode = mode
    r = _chat(front.url)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("upstream gpu-a answered 400: ")
    assert _leaks(r.text) == []
    assert "***" in message


def test_a_cookie_set_by_the_upstream_is_never_sent_back_and_explicit_headers_are(
        front: ThreadedServer, echoing: tuple[Echoing, ThreadedServer]) -> None:
    scripted, _ = echoing
    scripted.mode = "ok"
    with httpx.Client() as first, httpx.Client() as second:
        assert _chat(front.url, first).status_code == 200
        answer = _chat(front.url, second)
        assert answer.status_code == 200
        assert "set-cookie" not in answer.headers  # nor is the upstream's cookie relayed
    later = scripted.received[1]
    assert "cookie" not in later   # nothing learned from the first answer
    assert later.get("x-team-token") == TEAM_TOKEN   # the configured headers are sent


def test_the_masker_masks_a_prefix_only_at_a_cut() -> None:
    masker = Masker(["sk-abcdef"])
    assert masker.mask("a sk-abcdef b sk-ab") == "a *** b sk-ab"
    assert masker.mask("a sk-abcdef b sk-ab", cut=True) == "a *** b ***"
    assert masker.mask("ends with s", cut=True) == "ends with ***"
    assert masker.mask("nothing here", cut=True) == "nothing here"
