"""Images through Anthropic's Messages, OpenAI's Responses and Ollama's chat and generate: each
reply against what /v1/chat/completions answers for the same image and text (greedy; chat's
own image path is checked against the engine directly in test_images_api.py), usage counting
the image's positions, and each API's own 400 naming its block, part or image.

One vlm reference model (tests/data/vlm) served as the references were made (flash attention
off), and the same text model without its mmproj."""
from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import requests
import yaml

from gateway.app import create_app
from gateway.config import load_config
from tests.support.refs import VLM_DIR
from tests.support.servers import ThreadedServer

BASE = next(b for b in json.loads((VLM_DIR / "manifest.json").read_text())["bases"]
            if b["base"] == "llava_mlp_vlm")
MODEL = BASE["base"]
PNG = (VLM_DIR / BASE["images"][1]["image"]).read_bytes()
B64 = base64.b64encode(PNG).decode()
DATA_URL = "data:image/png;base64," + B64
QUESTION = "What is this?"
N = 6  # tokens to generate


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("images_apis") / "modelyard.yaml"
    text = str(VLM_DIR / BASE["text_file"])
    path.write_text(yaml.safe_dump({"models": [
        {"model": text, "mmproj": str(VLM_DIR / BASE["mmproj_file"]), "aliases": [MODEL],
         "n_ctx": 256, "flash_attn": False},
        {"model": text, "aliases": ["text-only"], "n_ctx": 256, "flash_attn": False}]}))
    srv = ThreadedServer(create_app(load_config(path)))
    srv.start_serving()
    yield srv
    srv.stop()


def _post(server: Any, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120)


def _chat(server: Any, content: list[dict[str, Any]]) -> tuple[str, int]:
    """/v1/chat/completions' greedy reply and prompt tokens: what every other API must say."""
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "max_tokens": N, "temperature": 0,
                                               "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]


TEXT = {"type": "text", "text": QUESTION}
IMAGE = {"type": "image_url", "image_url": {"url": DATA_URL}}


@pytest.fixture(scope="module")
def text_then_image(server: Any) -> tuple[str, int]:
    return _chat(server, [TEXT, IMAGE])


@pytest.fixture(scope="module")
def image_then_text(server: Any) -> tuple[str, int]:
    return _chat(server, [IMAGE, TEXT])


def test_the_image_counts_in_the_chat_prompt(server: Any, text_then_image: tuple[str, int]) -> None:
    _, text_only = _chat(server, [TEXT])
    assert text_then_image[1] > text_only + 8  # an image is more than 8 positions here


# ----------------------------------------------------------------------------------- Anthropic

def _anthropic_image(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


BASE64_SOURCE = {"type": "base64", "media_type": "image/png", "data": B64}


def test_anthropic_image_block_answers_as_chat(server: Any, text_then_image: tuple[str, int]) -> None:
    content = [{"type": "text", "text": QUESTION}, _anthropic_image(BASE64_SOURCE)]
    r = _post(server, "/v1/messages", {"model": MODEL, "max_tokens": N, "temperature": 0,
                                       "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "".join(b["text"] for b in body["content"] if b["type"] == "text") == text_then_image[0]
    usage = body["usage"]  # Anthropic's input_tokens leave out what the prompt cache read
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == text_then_image[1]
    counted = _post(server, "/v1/messages/count_tokens",
                    {"model": MODEL, "messages": [{"role": "user", "content": content}]})
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == text_then_image[1]


def _anthropic_refusal(r: requests.Response, words: list[str]) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    for word in words:
        assert word in body["error"]["message"], body


def test_anthropic_image_refusals_name_the_block(server: Any) -> None:
    def ask(model: str, source: dict[str, Any]) -> requests.Response:
        # a system prompt and an earlier turn: the chat request's indices differ from these
        return _post(server, "/v1/messages", {"model": model, "max_tokens": 1, "system": "Be brief.",
                                              "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "and?"},
                                         _anthropic_image(source)]}]})
    _anthropic_refusal(ask("text-only", BASE64_SOURCE), ["messages[2].content[1]", "takes no images"])
    _anthropic_refusal(ask(MODEL, {**BASE64_SOURCE, "data": "@@not base64@@"}),
                       ["messages[2].content[1]", "not valid base64"])
    _anthropic_refusal(ask(MODEL, {"type": "url", "url": "https://example.com/cat.png"}),
                       ["messages[2].content[1]", "does not fetch remote image URLs"])
    _anthropic_refusal(ask(MODEL, {"type": "base64", "media_type": "text/plain", "data": "aGk="}),
                       ["messages[2].content[1]", "not an image"])


# ------------------------------------------------------------------------------ OpenAI Responses

def _responses(server: Any, path: str, model: str, part: dict[str, Any],
               **extra: Any) -> requests.Response:
    return _post(server, path, {"model": model, **extra, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}, part]}]})


def test_responses_input_image_answers_as_chat(server: Any, text_then_image: tuple[str, int]) -> None:
    part = {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}
    r = _responses(server, "/v1/responses", MODEL, part, max_output_tokens=N, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    texts = [c["text"] for item in body["output"] if item["type"] == "message"
             for c in item["content"] if c["type"] == "output_text"]
    assert "".join(texts) == text_then_image[0]
    assert body["usage"]["input_tokens"] == text_then_image[1]
    counted = _responses(server, "/v1/responses/input_tokens", MODEL, part)
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == text_then_image[1]


@pytest.mark.parametrize("model,part,param,words", [
    ("text-only", {"image_url": DATA_URL}, "input[0].content[1]", "takes no images"),
    (MODEL, {"image_url": "data:image/png;base64,%%%"}, "input[0].content[1]", "not valid base64"),
    (MODEL, {"file_id": "file-abc"}, "input[0].content[1].file_id", "files are not supported"),
])
def test_responses_image_refusals_name_the_part(server: Any, model: str, part: dict[str, Any],
                                                param: str, words: str) -> None:
    r = _responses(server, "/v1/responses", model, {"type": "input_image", **part},
                   max_output_tokens=1)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


# ---------------------------------------------------------------------------------------- Ollama

OPTIONS = {"temperature": 0, "num_predict": N}


def test_ollama_chat_images_answer_as_chat(server: Any, image_then_text: tuple[str, int]) -> None:
    r = _post(server, "/api/chat", {"model": MODEL, "stream": False, "options": OPTIONS,
                                    "messages": [{"role": "user", "content": QUESTION,
                                                  "images": [B64]}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["message"]["content"] == image_then_text[0]
    assert body["prompt_eval_count"] == image_then_text[1]


def test_ollama_generate_images_answer_as_chat(server: Any,
                                               image_then_text: tuple[str, int]) -> None:
    r = _post(server, "/api/generate", {"model": MODEL, "stream": False, "options": OPTIONS,
                                        "prompt": QUESTION, "images": [B64]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["response"] == image_then_text[0]
    assert body["prompt_eval_count"] == image_then_text[1]


def _ollama_refusal(r: requests.Response, words: list[str]) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert isinstance(error, str)
    for word in words:
        assert word in error, error


def test_ollama_image_refusals_name_the_image(server: Any) -> None:
    def chat(model: str, images: list[str]) -> requests.Response:
        return _post(server, "/api/chat", {"model": model, "stream": False, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": QUESTION, "images": images}]})
    _ollama_refusal(chat("text-only", [B64]), ["messages[2].images[0]", "takes no images"])
    _ollama_refusal(chat(MODEL, [B64, "%%%"]), ["messages[2].images[1]", "not valid base64"])
    r = _post(server, "/api/generate", {"model": "text-only", "stream": False, "prompt": QUESTION,
                                        "images": [B64]})
    _ollama_refusal(r, ["images[0]", "takes no images"])
    r = _post(server, "/api/generate", {"model": MODEL, "stream": False, "prompt": QUESTION,
                                        "images": ["%%%"]})
    _ollama_refusal(r, ["images[0]", "not valid base64"])
    r = _post(server, "/api/generate", {"model": MODEL, "stream": False, "prompt": QUESTION,
                                        "raw": True, "images": [B64]})
    _ollama_refusal(r, ["images", "raw"])


def test_ollama_show_says_vision_only_for_the_entry_with_a_projector(server: Any) -> None:
    # Open WebUI and editors offer image upload by this list; every entry also embeds
    for model, vision in ((MODEL, True), ("text-only", False)):
        shown = _post(server, "/api/show", {"model": model})
        assert shown.status_code == 200, shown.text
        capabilities = shown.json()["capabilities"]
        assert ("vision" in capabilities) is vision
        assert {"completion", "tools", "embedding"} <= set(capabilities)
        embedded = _post(server, "/api/embed", {"model": model, "input": "hi"})
        assert embedded.status_code == 200 and len(embedded.json()["embeddings"]) == 1
