"""Images in a request -> the Prompt the batch runs: the one path every API's image parts take.

    ImagePart(param, url | data)     what a wire found: OpenAI's image_url, llama.cpp's
                                     multimodal_data, (Anthropic's image block, Responses'
                                     input_image: the same two shapes)
    await load_images(parts, limits) -> bytes per part   on the event loop: data: URLs and
                                     base64 decoded, http(s) fetched only if limits allow it
    image_prompt(served, text, images, marker)           on the model's prep threads: decode,
                                     preprocess and encode each image (engine.vision), then
                                     engine.vision.layout splits `text` at the markers
    await prompt_with_images(served, alias, parts, render, limits)   all three in one call: a
                                     wire that renders text with a marker per part (chat: the
                                     template) gets its Prompt

Every refusal is a 400 naming the part (`param`): a model without an mmproj, bad base64, a
data URL that is not an image, a remote URL while fetching is off (or a host not allowed, a
body too large, too slow), an undecodable or truncated image, a decompression bomb
(engine/vision/preprocess.py BOMB_PIXELS; an image over PIXEL_BUDGET is scaled down, not
refused), more images than the context holds. Decoding and encoding never run on the event
loop (nor does base64 of a large data URL), so a large image delays only its own request (and
the model's other preparations queued behind it), never the stream of another.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import engine
from gateway.config import LimitSettings
from gateway.errors import context_length_exceeded, invalid_request
from gateway.generation.model import GenerativeModel

_INLINE_BASE64 = 256 << 10  # data URLs longer than this are decoded on a worker thread
MEDIA_MARKER = "<__media__>"  # llama-server's (mtmd's default): where an image goes in a prompt


@dataclass(frozen=True)
class ImagePart:
    """One image of a request: a URL (data: or http(s)) or bytes already decoded from base64."""
    param: str                  # where it was in the request, for errors: messages[0].content[1]
    url: str | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class LoadedImage:
    param: str
    data: bytes                 # the encoded image file (PNG, JPEG, ...)


def decode_base64(text: str, param: str) -> bytes:
    """Strict base64 (whitespace allowed between lines, as data URLs carry it); a 400 if not."""
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_request(f"{param}: the image is not valid base64", param) from None
    if not data:
        raise invalid_request(f"{param}: the image is empty", param)
    return data


def data_url_bytes(url: str, param: str) -> bytes:
    """The bytes of `data:image/...;base64,...` (llama-server takes the same form)."""
    head, comma, body = url.partition(",")
    if not comma or not head.startswith("data:"):
        raise invalid_request(f"{param}: a data URL needs the form data:image/png;base64,...",
                              param)
    media = head[5:].split(";")
    if media[0] and not media[0].startswith("image/"):
        raise invalid_request(f"{param}: a data URL of type {media[0]!r} is not an image", param)
    if "base64" not in media[1:]:
        raise invalid_request(f"{param}: only base64 data URLs are supported", param)
    return decode_base64(body, param)


def check_takes_images(served: GenerativeModel, alias: str, parts: Sequence[ImagePart]) -> None:
    """A 400 before anything is decoded when the model has no projector."""
    if parts and served.vision is None:
        raise invalid_request(f"{parts[0].param}: model {alias!r} takes no images (its entry has "
                              "no `mmproj`)", parts[0].param)


async def load_images(parts: Sequence[ImagePart], limits: LimitSettings) -> list[LoadedImage]:
    """Each part's image file bytes: decoded here (cheap), or fetched when limits allow it."""
    out: list[LoadedImage] = []
    for part in parts:
        if part.data is not None:
            out.append(LoadedImage(part.param, part.data))
            continue
        url = (part.url or "").strip()
        scheme = urlsplit(url).scheme.lower()
        if scheme == "data" and len(url) > _INLINE_BASE64:  # ~10 ms per MB: off the loop
            out.append(LoadedImage(part.param,
                                   await asyncio.to_thread(data_url_bytes, url, part.param)))
        elif scheme == "data":
            out.append(LoadedImage(part.param, data_url_bytes(url, part.param)))
        elif scheme in ("http", "https"):
            out.append(LoadedImage(part.param, await _fetch(url, part.param, limits)))
        else:
            raise invalid_request(f"{part.param}: an image URL must be a data: URL (or http(s) "
                                  "when the server fetches remote images)", part.param)
    return out


async def _fetch(url: str, param: str, limits: LimitSettings) -> bytes:
    if not limits.remote_images:
        raise invalid_request(f"{param}: this server does not fetch remote image URLs "
                              "(limits.remote_images is off); send the image as a data: URL",
                              param)
    host = (urlsplit(url).hostname or "").lower()
    allowed = [h.lower() for h in limits.remote_image_hosts]
    if allowed and host not in allowed:
        raise invalid_request(f"{param}: image URLs may name only {', '.join(allowed)} "
                              f"(limits.remote_image_hosts), not {host!r}", param)
    import httpx

    cap = limits.remote_image_max_bytes
    try:
        async with httpx.AsyncClient(timeout=limits.remote_image_timeout,
                                     follow_redirects=False) as client, client.stream("GET", url) as response:
            if response.status_code != 200:
                raise invalid_request(f"{param}: fetching the image URL answered HTTP "
                                      f"{response.status_code}", param)
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > cap:
                    raise invalid_request(f"{param}: the image at the URL is larger than "
                                          f"{cap} bytes (limits.remote_image_max_bytes)", param)
    except httpx.TimeoutException:
        raise invalid_request(f"{param}: fetching the image URL took longer than "
                              f"{limits.remote_image_timeout:g}s (limits.remote_image_timeout)",
                              param) from None
    except httpx.HTTPError as e:
        raise invalid_request(f"{param}: cannot fetch the image URL ({type(e).__name__})",
                              param) from None
    return bytes(body)


def image_prompt(served: GenerativeModel, text: str, images: Sequence[LoadedImage],
                 marker: str = MEDIA_MARKER, param: str = "prompt") -> engine.Prompt:
    """`text` with each `marker` replaced by the next image. Runs on the model's prep threads
    (decoding and the vision encoder are CPU work); the prompt must leave room to generate."""
    from engine.vision import ImageError
    from engine.vision.layout import image_prompt as lay_out

    vision = served.vision
    assert vision is not None, "check_takes_images first"
    if text.count(marker) != len(images):
        raise invalid_request(f"{param}: the prompt has {text.count(marker)} media markers "
                              f"({marker}) for {len(images)} images", param)
    at_least = len(images) * vision.tokens_per_tile()  # an image is at least one tile
    if at_least >= served.n_ctx:
        raise invalid_request(f"{images[-1].param}: {len(images)} images take at least "
                              f"{at_least} positions; the context holds {served.n_ctx}",
                              images[-1].param)
    encoded = []
    for image in images:
        try:
            encoded.append(vision.encode(image.data))
        except ImageError as e:
            raise invalid_request(f"{image.param}: {e}", image.param) from None
    bos = served.chat_template.bos_token
    if bos and served.tokenizer.add_bos and text.startswith(bos):
        text = text[len(bos):]  # mtmd adds BOS itself (add_special): never twice
    prompt = lay_out(text, encoded, vision.hp, served.tokenizer, marker)  # type: ignore[arg-type]
    if len(prompt) >= served.n_ctx:
        raise context_length_exceeded(len(prompt), served.n_ctx, images[-1].param)
    return prompt


async def prompt_with_images(served: GenerativeModel, alias: str, parts: Sequence[ImagePart],
                             render: Callable[[], str], limits: LimitSettings,
                             marker: str = MEDIA_MARKER, param: str = "messages") -> engine.Prompt:
    """The Prompt of a request with image `parts`: `render()` (run on the prep threads) gives
    its text with one `marker` where each part goes, in order."""
    check_takes_images(served, alias, parts)
    loaded = await load_images(parts, limits)

    def build() -> engine.Prompt:
        return image_prompt(served, render(), loaded, marker, param)

    return await served.prepare(build)
