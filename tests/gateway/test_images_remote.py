"""Remote image URLs (limits.remote_images): off by default (tests/test_images_api.py), and when
switched on fetched within a size limit, a timeout and a host allowlist, from a local HTTP
server here; a fetched image gives the tokens its data: URL gives."""
from __future__ import annotations

import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
import yaml

from gateway.app import create_app
from gateway.config import load_config
from tests.support.refs import VLM_DIR
from tests.support.servers import ThreadedServer

PNG = (VLM_DIR / "image1_64x64.png").read_bytes()
MAX_BYTES = 50_000


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/slow.png":
            time.sleep(2.0)
        body = {"/cat.png": PNG, "/slow.png": PNG, "/big.png": PNG * (MAX_BYTES // len(PNG) + 2)
                }.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def images_url() -> Any:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("remote") / "modelyard.yaml"
    path.write_text(yaml.safe_dump({
        "limits": {"remote_images": True, "remote_image_max_bytes": MAX_BYTES,
                   "remote_image_timeout": "0.5s", "remote_image_hosts": ["127.0.0.1"]},
        "models": [{"model": str(VLM_DIR / "llava_mlp_vlm_text_f32.gguf"),
                    "mmproj": str(VLM_DIR / "llava_mlp_vlm_mmproj_f32.gguf"),
                    "aliases": ["llava"], "n_ctx": 256, "flash_attn": False}]}))
    srv = ThreadedServer(create_app(load_config(path)))
    srv.start_serving()
    yield srv
    srv.stop()


def _chat(server: Any, url: str) -> requests.Response:
    return requests.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "llava", "max_tokens": 4, "temperature": 0, "logprobs": True, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is it?"}]}]})


def test_a_fetched_image_is_the_same_as_its_data_url(server: Any, images_url: str) -> None:
    fetched = _chat(server, images_url + "/cat.png")
    inline = _chat(server, "data:image/png;base64," + base64.b64encode(PNG).decode())
    assert fetched.status_code == inline.status_code == 200, fetched.text
    assert fetched.json()["choices"][0]["logprobs"] == inline.json()["choices"][0]["logprobs"]
    assert fetched.json()["usage"]["prompt_tokens"] == inline.json()["usage"]["prompt_tokens"]
    # the same bytes are the same image: the second request reads its rows from the cache
    assert inline.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize("path,words", [
    ("/big.png", "limits.remote_image_max_bytes"),
    ("/slow.png", "limits.remote_image_timeout"),
    ("/missing.png", "HTTP 404"),
])
def test_fetching_within_the_limits(server: Any, images_url: str, path: str, words: str) -> None:
    r = _chat(server, images_url + path)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].content[0]"
    assert words in r.json()["error"]["message"]


def test_a_host_outside_the_allowlist_is_not_fetched(server: Any, images_url: str) -> None:
    r = _chat(server, images_url.replace("127.0.0.1", "localhost") + "/cat.png")
    assert r.status_code == 400, r.text
    assert "limits.remote_image_hosts" in r.json()["error"]["message"]
