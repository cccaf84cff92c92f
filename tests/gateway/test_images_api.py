"""Images through the APIs (gateway/generation/images.py): llama.cpp's `/completion` with
`multimodal_data` against llama.cpp's own greedy tokens and last logits after an image prompt
(tests/data/vlm), OpenAI chat `image_url` parts against the engine fed the same rendered prompt
directly (engine.vision.layout.image_prompt + engine.Model, no gateway), image and text requests
batched together against each alone, and every bad input as a 400 naming its part.

Served entries run as the references were made: flash attention off, n_ctx 256."""
from __future__ import annotations

import base64
import io
import json
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from PIL import Image

from engine.api import Model
from engine.prompt import Prompt
from engine.vision import VisionModel
from engine.vision.layout import image_prompt
from gateway.app import create_app
from gateway.config import load_config
from tests.support.refs import VLM_DIR
from tests.support.servers import ThreadedServer

MANIFEST = json.loads((VLM_DIR / "manifest.json").read_text())
BASES = {b["base"]: b for b in MANIFEST["bases"]}
CASES = [(b["base"], im) for b in MANIFEST["bases"] for im in b["images"]]
IDS = [f"{b}-{im['image'].split('_')[0]}" for b, im in CASES]
N_CTX = 256
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "top_k": 1}
# the chat templates of the vlm text models, rendered by hand for one user message whose
# content is [text, image]: gemma3's puts <bos> first (mtmd adds BOS itself), the others chatml
CHAT_TEXT = {
    "gemma3_vlm": "<start_of_turn>user\nWhat is this?\n<__media__><end_of_turn>\n"
                  "<start_of_turn>model\n",
    "idefics3_vlm": "<|im_start|>user\nWhat is this?\n<__media__><|im_end|>\n"
                    "<|im_start|>assistant\n",
    "llava_mlp_vlm": "<|im_start|>user\nWhat is this?\n<__media__><|im_end|>\n"
                     "<|im_start|>assistant\n",
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _image(case: dict[str, Any]) -> bytes:
    return (VLM_DIR / case["image"]).read_bytes()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header says width x height (valid CRCs), with almost no pixel data: what a
    decompression bomb looks like to a decoder before it allocates."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("images") / "modelyard.yaml"
    models: list[dict[str, Any]] = [
        {"model": str(VLM_DIR / b["text_file"]), "mmproj": str(VLM_DIR / b["mmproj_file"]),
         "aliases": [name], "n_ctx": N_CTX, "n_parallel": 3, "flash_attn": False}
        for name, b in BASES.items()]
    models.append({"model": str(VLM_DIR / BASES["llava_mlp_vlm"]["text_file"]),
                   "aliases": ["text-only"], "n_ctx": N_CTX, "flash_attn": False})
    path.write_text(yaml.safe_dump({"registry": {"max_loaded_models": 4}, "models": models}))
    srv = ThreadedServer(create_app(load_config(path)))
    srv.start_serving()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def direct() -> Any:
    """The engine without the gateway: the independent path chat is compared with."""
    out = {name: (Model(VLM_DIR / b["text_file"], n_ctx=N_CTX, flash_attn=False, images=True),
                  VisionModel(VLM_DIR / b["mmproj_file"])) for name, b in BASES.items()}
    yield out
    for tm, vm in out.values():
        tm.close()
        vm.close()


def _post(server: Any, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120)


def _completion(server: Any, base: str, case: dict[str, Any], **extra: Any) -> dict[str, Any]:
    r = _post(server, "/completion", {
        "model": base, "prompt": {"prompt_string": BASES[base]["prompt"]["text"],
                                  "multimodal_data": [_b64(_image(case))]},
        "n_predict": len(case["greedy"]), "return_tokens": True, **GREEDY, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _until_near_tie(case: dict[str, Any]) -> int:
    """How many of llama.cpp's greedy tokens are decisive (a near-tie and what follows is not)."""
    margins = case["greedy_top1_top2_margins"]
    return next((i for i, m in enumerate(margins) if m < 0.01), len(margins))


# ----------------------------------------------------------------------- /completion vs llama.cpp

@pytest.mark.parametrize("base,case", CASES, ids=IDS)
def test_completion_with_multimodal_data_is_llama_cpps_greedy_and_last_logits(
        server: Any, base: str, case: dict[str, Any]) -> None:
    body = _completion(server, base, case, n_probs=5)
    n = _until_near_tie(case)
    assert body["tokens"][:n] == case["greedy"][:n]
    # the image's rows count as prompt tokens (llama.cpp's "misreported prompt tokens" fixed)
    assert body["tokens_evaluated"] == case["n_prompt_positions"]
    # the first token's top-5 log-probabilities against llama.cpp's logits after the prompt
    ref = np.load(VLM_DIR / case["npz"])["logits_last"].astype(np.float64)
    ref_logprobs = ref - (ref.max() + np.log(np.exp(ref - ref.max()).sum()))
    tol = case["suggested_tolerance"]["logits_max_abs"]
    for top in body["completion_probabilities"][0]["top_logprobs"]:
        assert abs(top["logprob"] - ref_logprobs[top["id"]]) <= 2 * tol, top


def test_multimodal_data_beside_a_string_prompt_means_the_same(server: Any) -> None:
    base, case = CASES[-1]
    want = _completion(server, base, case)
    r = _post(server, "/completion", {
        "model": base, "prompt": BASES[base]["prompt"]["text"],
        "multimodal_data": [_b64(_image(case))], "n_predict": len(case["greedy"]),
        "return_tokens": True, **GREEDY})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == want["tokens"]


def test_props_and_model_lists_say_which_entries_take_images(server: Any) -> None:
    props = requests.get(server.url + "/props", params={"model": "gemma3_vlm"}, timeout=30).json()
    assert props["modalities"]["vision"] is True
    assert props["media_marker"] == "<__media__>"
    text = requests.get(server.url + "/props", params={"model": "text-only"}, timeout=30).json()
    assert text["modalities"]["vision"] is False
    cards = {c["id"]: c for c in requests.get(server.url + "/v1/models", timeout=30).json()["data"]}
    assert cards["idefics3_vlm"]["modelyard"]["images"] is True
    assert cards["text-only"]["modelyard"]["images"] is False
    rows = {r["aliases"][0]: r for r in
            requests.get(server.url + "/admin/models", timeout=30).json()["data"]}
    assert rows["llava_mlp_vlm"]["mmproj"] == str(VLM_DIR / BASES["llava_mlp_vlm"]["mmproj_file"])
    assert rows["text-only"]["mmproj"] is None


# ------------------------------------------------------------- OpenAI chat vs the engine directly

def _direct_greedy(direct: Any, base: str, case: dict[str, Any], n: int) -> tuple[Prompt, list[int]]:
    tm, vm = direct[base]
    prompt = image_prompt(CHAT_TEXT[base], [vm.encode(_image(case))], vm.hp, tm.tokenizer)
    ids: list[int] = []
    for _ in range(n):
        logits = tm.logits(prompt + Prompt.of_tokens(ids))[-1]
        second, first = np.sort(logits)[-2:]
        if first - second < 0.01:  # a near-tie: not decisive, nor what follows
            break
        ids.append(int(logits.argmax()))
        if ids[-1] in tm.tokenizer.eog_ids:
            break
    return prompt, ids


@pytest.mark.parametrize("base,case", CASES, ids=IDS)
def test_chat_image_url_is_the_engine_fed_the_rendered_prompt(
        server: Any, direct: Any, base: str, case: dict[str, Any]) -> None:
    prompt, want = _direct_greedy(direct, base, case, 6)
    url = "data:image/png;base64," + _b64(_image(case))
    r = _post(server, "/v1/chat/completions", {
        "model": base, "max_tokens": 6, "logprobs": True, **GREEDY, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url",
                                          "image_url": {"url": url, "detail": "high"}}]}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(prompt)
    tm, _ = direct[base]
    got = [bytes(t["bytes"]) for t in body["choices"][0]["logprobs"]["content"]]
    want_bytes = [tm.tokenizer.token_bytes(t) for t in want if t not in tm.tokenizer.eog_ids]
    assert got[:len(want_bytes)] == want_bytes


# --------------------------------------------------------------------------------- batching

def test_image_and_text_requests_batched_get_the_bits_each_gets_alone(server: Any) -> None:
    base, case = CASES[1]
    image_body = {"model": base, "prompt": {"prompt_string": BASES[base]["prompt"]["text"],
                                            "multimodal_data": [_b64(_image(case))]},
                  "n_predict": 6, "n_probs": 3, **GREEDY}
    text_body = {"model": base, "prompt": "<start_of_turn>user\nHello there<end_of_turn>\n",
                 "n_predict": 6, "n_probs": 3, **GREEDY}

    def probs(body: dict[str, Any]) -> Any:
        r = _post(server, "/completion", body)
        assert r.status_code == 200, r.text
        return r.json()["completion_probabilities"]

    alone = [probs(image_body), probs(text_body)]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(probs, [image_body, text_body, image_body, text_body]))
    assert together == [alone[0], alone[1], alone[0], alone[1]]


# --------------------------------------------------------------------------------- bad input

def _chat_with(server: Any, model: str, url: str) -> requests.Response:
    return _post(server, "/v1/chat/completions", {"model": model, "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {"url": url}}]}]})


def _refused(r: requests.Response, param: str, words: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert words in error["message"], error


def test_an_image_for_a_model_without_mmproj_is_a_400(server: Any) -> None:
    png = _image(CASES[0][1])
    _refused(_chat_with(server, "text-only", "data:image/png;base64," + _b64(png)),
             "messages[0].content[1]", "takes no images")
    r = _post(server, "/completion", {"model": "text-only", "prompt": {
        "prompt_string": "a <__media__>", "multimodal_data": [_b64(png)]}, "n_predict": 1})
    _refused(r, "prompt.multimodal_data", "takes no images")


@pytest.mark.parametrize("what,data,words", [
    ("not an image", b"this is plain text, not a picture", "cannot decode"),
    ("truncated", (VLM_DIR / "image1_64x64.png").read_bytes()[:120], "cannot decode"),
    ("8000x8000 header, no pixels", _png_header_only(8000, 8000), "cannot decode"),
    ("decompression bomb", _png_header_only(20000, 20000), "decompression bomb"),
])
def test_unusable_images_are_400s_naming_the_part(server: Any, what: str, data: bytes,
                                                  words: str) -> None:
    _refused(_chat_with(server, "llava_mlp_vlm", "data:image/png;base64," + _b64(data)),
             "messages[0].content[1]", words)
    r = _post(server, "/completion", {"model": "llava_mlp_vlm", "prompt": {
        "prompt_string": "a <__media__> b <__media__>",
        "multimodal_data": [_b64(_image(CASES[0][1])), _b64(data)]}, "n_predict": 1})
    _refused(r, "prompt.multimodal_data[1]", words)


def test_a_huge_image_is_scaled_down_and_answered(server: Any) -> None:
    """8000x8000 (64 Mpx, over the 40 Mpx budget) is box-reduced, not refused."""
    buf = io.BytesIO()
    Image.linear_gradient("L").resize((8000, 8000)).convert("RGB").save(buf, "PNG", compress_level=1)
    r = _chat_with(server, "gemma3_vlm", "data:image/png;base64," + _b64(buf.getvalue()))
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    small = _chat_with(server, "gemma3_vlm", "data:image/png;base64," + _b64(_image(CASES[0][1])))
    assert usage["prompt_tokens"] == small.json()["usage"]["prompt_tokens"]  # one image, same size


def test_other_requests_are_answered_while_an_image_is_encoded(
        server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's encode is held until the other requests are done: if decoding or encoding ran
    on the event loop, nothing else could be answered and this test would time out."""
    entered, release = threading.Event(), threading.Event()
    encode = VisionModel.encode

    def held(self: VisionModel, data: bytes) -> Any:
        entered.set()
        release.wait(60)
        return encode(self, data)

    monkeypatch.setattr(VisionModel, "encode", held)
    url = "data:image/png;base64," + _b64(_image(CASES[0][1]))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_chat_with, server, "gemma3_vlm", url)
        try:
            assert entered.wait(60)
            assert requests.get(server.url + "/health", timeout=30).status_code == 200
            r = _post(server, "/v1/chat/completions", {
                "model": "text-only", "max_tokens": 2, **GREEDY,
                "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            assert not pending.done()  # the image request was still held all along
        finally:
            release.set()
        assert pending.result(timeout=120).status_code == 200


def test_bad_base64_and_urls_are_400s(server: Any) -> None:
    _refused(_chat_with(server, "gemma3_vlm", "data:image/png;base64,@@not-base64@@"),
             "messages[0].content[1]", "not valid base64")
    _refused(_chat_with(server, "gemma3_vlm", "data:text/plain;base64,aGk="),
             "messages[0].content[1]", "not an image")
    _refused(_chat_with(server, "gemma3_vlm", "https://example.com/cat.png"),
             "messages[0].content[1]", "does not fetch remote image URLs")
    _refused(_chat_with(server, "gemma3_vlm", "file:///etc/passwd"),
             "messages[0].content[1]", "must be a data: URL")
    r = _post(server, "/completion", {"model": "gemma3_vlm", "prompt": {
        "prompt_string": "<__media__>", "multimodal_data": ["%%%"]}, "n_predict": 1})
    _refused(r, "prompt.multimodal_data[0]", "not valid base64")


def test_markers_and_images_must_match_in_number(server: Any) -> None:
    png = _b64(_image(CASES[0][1]))
    r = _post(server, "/completion", {"model": "gemma3_vlm", "prompt": {
        "prompt_string": "no marker here", "multimodal_data": [png]}, "n_predict": 1})
    _refused(r, "prompt", "0 media markers")


def test_more_images_than_the_context_holds_is_a_400(server: Any) -> None:
    png = _b64(_image(CASES[-1][1]))
    n = N_CTX // 8  # an image is at least 9 positions in every projector here
    r = _post(server, "/completion", {"model": "gemma3_vlm", "prompt": {
        "prompt_string": "<__media__>" * n, "multimodal_data": [png] * n}, "n_predict": 1})
    assert r.status_code == 400, r.text
    assert "context" in r.json()["error"]["message"]
    assert r.json()["error"]["param"].startswith("prompt")
    # and the server still serves afterwards
    assert _completion(server, *CASES[0])["tokens"]


def test_a_message_with_text_parts_only_is_unchanged(server: Any) -> None:
    r = _post(server, "/v1/chat/completions", {"model": "text-only", "max_tokens": 2, **GREEDY,
                                               "messages": [{"role": "user", "content": [
                                                   {"type": "text", "text": "hi"}]}]})
    assert r.status_code == 200, r.text


def test_remote_image_settings_are_config_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"limits": {
        "remote_images": True, "remote_image_max_bytes": "1MiB", "remote_image_timeout": "3s",
        "remote_image_hosts": ["images.example"]}, "models": [{
            "model": str(VLM_DIR / BASES["gemma3_vlm"]["text_file"]),
            "clip_model_path": str(VLM_DIR / BASES["gemma3_vlm"]["mmproj_file"])}]}))
    config = load_config(path)
    assert config.limits.remote_images and config.limits.remote_image_max_bytes == 1024 * 1024
    assert config.limits.remote_image_timeout == 3.0
    assert config.models[0].mmproj == VLM_DIR / BASES["gemma3_vlm"]["mmproj_file"]


def test_a_streamed_chat_with_an_image_says_what_the_whole_answer_says(server: Any) -> None:
    base, case = CASES[4]
    body = {"model": base, "max_tokens": 6, **GREEDY, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(_image(case))}}]}]}
    whole = _post(server, "/v1/chat/completions", body).json()
    pieces = []
    with requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True},
                       stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            text = line.decode()
            if text.startswith("data: ") and text != "data: [DONE]":
                for choice in json.loads(text[6:])["choices"]:
                    pieces.append(choice["delta"].get("content") or "")
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]
