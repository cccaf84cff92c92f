import asyncio
import json

import pydantic_core
import pytest
from starlette.requests import Request

from gateway import protocol as p
from gateway.errors import APIError
from gateway.http.streaming import (
    DONE,
    EventStreamResponse,
    TextEventTemplate,
    _json_string,
    cancel_on_disconnect,
    sse,
    sse_body,
)


def chunk(text: str) -> p.ChatCompletionChunk:
    return p.ChatCompletionChunk(id="c", created=1, model="m", choices=[
        p.ChunkChoice(index=0, delta=p.ChoiceDelta(content=text))])


class Source:
    """An async iterator of chunks that records whether its cleanup ran."""

    def __init__(self, texts, fail_after=None):
        self.texts = texts
        self.fail_after = fail_after
        self.closed = False

    async def gen(self):
        try:
            for i, text in enumerate(self.texts):
                if i == self.fail_after:
                    raise APIError(503, "model went away", type="server_error", code="gone")
                yield chunk(text)
                await asyncio.sleep(0)
        finally:
            self.closed = True


def test_sse_is_one_data_line_per_event():
    event = sse(chunk("a\nb"))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[6:])["choices"][0]["delta"]["content"] == "a\nb"


def test_sse_body_ends_with_done():
    async def main():
        src = Source(["a", "b"])
        return src, [e async for e in sse_body(src.gen())]

    src, events = asyncio.run(main())
    assert events[-1] == DONE and len(events) == 3 and src.closed


def test_error_mid_stream_is_an_error_event_without_done():
    async def main():
        src = Source(["a", "b", "c"], fail_after=1)
        return src, [e async for e in sse_body(src.gen())]

    src, events = asyncio.run(main())
    assert len(events) == 2 and DONE not in events and src.closed
    assert json.loads(events[1][6:]) == {"error": {"message": "model went away", "type": "server_error",
                                                   "param": None, "code": "gone"}}


def scope():
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "POST",
            "path": "/", "headers": []}


async def serve(response, send, receive=None):
    async def never():
        await asyncio.Event().wait()

    await response(scope(), receive or never, send)


def test_release_once_when_the_stream_completes():
    released = []
    sent = []

    async def main():
        src = Source(["a", "b"])
        response = EventStreamResponse(src.gen(), on_close=lambda: released.append(1))

        async def send(message):
            sent.append(message)

        await serve(response, send)
        return src

    src = asyncio.run(main())
    assert released == [1] and src.closed
    assert sent[-2]["body"] == DONE


def test_release_once_when_the_client_disconnects_mid_stream():
    released = []

    async def main():
        src = Source(["a"] * 1000)
        response = EventStreamResponse(src.gen(), on_close=lambda: released.append(1))
        messages = 0

        async def send(message):
            nonlocal messages
            messages += 1
            if messages == 3:
                await asyncio.sleep(3600)  # stalls until the disconnect cancels it

        async def receive():
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        await serve(response, send, receive)
        return src

    src = asyncio.run(main())
    assert released == [1] and src.closed


def test_release_even_when_the_body_never_started():
    released = []

    async def main():
        src = Source(["a"])
        response = EventStreamResponse(src.gen(), on_close=lambda: released.append(1))

        async def send(message):
            raise OSError("connection reset")

        with pytest.raises(OSError):
            await serve(response, send)

    asyncio.run(main())
    assert released == [1]


def fake_request(disconnect_after: float | None) -> Request:
    async def receive():
        if disconnect_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(disconnect_after)
        return {"type": "http.disconnect"}

    return Request(scope(), receive)


def test_cancel_on_disconnect():
    async def slow(log):
        try:
            await asyncio.sleep(3600)
        finally:
            log.append("cancelled")

    async def main():
        log = []
        with pytest.raises(asyncio.CancelledError):
            await cancel_on_disconnect(fake_request(0.01), slow(log))
        result = await cancel_on_disconnect(fake_request(None), asyncio.sleep(0, "done"))
        return log, result

    log, result = asyncio.run(main())
    assert log == ["cancelled"] and result == "done"


def test_unicode_line_separators_are_escaped_in_events() -> None:
    """U+2028, U+2029 and U+0085 stay inside their JSON string: every reader sees one line."""
    text = "a\u2028b\u2029c\u0085d"
    event = sse({"content": text}).decode()
    assert len(event.rstrip("\n").splitlines()) == 1
    assert json.loads(event[len("data: "):])["content"] == text


# --------------------------------------------------------------------------------- text templates

TRICKY_TEXTS = ["", "a", " the", 'say "hi"', "back\\slash", "line\nbreak\ttab\r", "\x00\x01\x1f\x7f",
                "a\u2028b\u2029c\u0085d", "héllo wörld", "日本語", "🙂👍🏽", "\ufffd", "-987654321",
                TextEventTemplate.TEXT, '"index":-987654321', "}]},{"]


def test_json_string_encoding_agrees_with_pydantic_on_every_code_point() -> None:
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert _json_string(every).encode() == pydantic_core.to_json(every)


def _chat_chunk(cid: str, alias: str, index: int, text: str) -> p.ChatCompletionChunk:
    return p.ChatCompletionChunk(id=cid, created=1700000000, model=alias, choices=[
        p.ChunkChoice(index=index, delta=p.ChoiceDelta(content=text))])


def _completion_chunk(cid: str, alias: str, index: int, text: str) -> p.Completion:
    return p.Completion(id=cid, created=1700000000, model=alias, choices=[
        p.CompletionChoice(index=index, text=text, finish_reason=None)])


@pytest.mark.parametrize("make", [_chat_chunk, _completion_chunk])
@pytest.mark.parametrize("alias", ["smollm2", "odd-987654321 \u2028 \"name\""])
def test_text_event_template_gives_pydantics_event(make, alias) -> None:
    """Each filled-in event parses to the same fields as pydantic's JSON of that chunk, and is in
    fact the same bytes; an alias containing a marker does not confuse the template."""
    template = TextEventTemplate(make("chatcmpl-x", alias, TextEventTemplate.INDEX,
                                      TextEventTemplate.TEXT))
    for index in (0, 1, 15):
        for text in TRICKY_TEXTS:
            ours = template.event(index, text)
            expected = make("chatcmpl-x", alias, index, text)
            assert ours.startswith(b"data: ") and ours.endswith(b"\n\n")
            assert len(ours.decode().rstrip("\n").splitlines()) == 1
            assert json.loads(ours[len(b"data: "):]) == json.loads(expected.model_dump_json())
            assert ours == sse(expected)
