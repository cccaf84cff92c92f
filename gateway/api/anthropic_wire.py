"""Anthropic's Messages API as a wire of the one pipeline (gateway/api/pipeline.py).

The plan is the chat plan of the request's chat twin (gateway/api/anthropic_request.py), so
tools and reasoning are read by the same ReplyReader (gateway/generation/tool_stream.py) as
OpenAI's chat: its reasoning becomes `thinking` blocks, its content `text` blocks, its calls
`tool_use` blocks (streamed: a call's arguments as `input_json_delta`s).

A stream, as Anthropic's reference and the SDK's accumulator (MessageStream) read it:

    message_start  ping  (ping while a long prompt is read)
    ( content_block_start  content_block_delta*  content_block_stop )*   one block open at once
    message_delta (stop_reason, stop_sequence, usage)  message_stop

Every event is named (`event: <type>`) and carries its type in the data too; there is no
`[DONE]`. An error after the headers is an `error` event, which the SDK raises.
"""
from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from gateway.api import anthropic_request
from gateway.api.openai_wire import with_defaults
from gateway.config import LimitSettings
from gateway.errors import APIError
from gateway.fleet.registry import Lease
from gateway.generation import serving
from gateway.generation.choices import ChoiceResult, choice_events
from gateway.generation.events import Finished, PromptProgress, TextDelta
from gateway.generation.model import GenerativeModel
from gateway.generation.serving import Plan
from gateway.generation.tool_stream import ReplyReader
from gateway.http.streaming import SSE_EVENTS
from gateway.protocol import anthropic as a
from gateway.protocol.chat import ChoiceDelta

# --------------------------------------------------------------------------------- errors

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 529: "overloaded_error"}
OVERLOADED = 529  # Anthropic's status for "too busy now", which its SDK retries


def error_shape(err: APIError) -> tuple[int, dict[str, Any]]:
    """An APIError as Anthropic's status and body: a full queue (our 503 server_busy) is its
    529 overloaded_error."""
    status = OVERLOADED if err.code == "server_busy" else err.status
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = a.ErrorResponse(error=a.ErrorDetail(type=kind, message=err.message),
                           request_id=f"req_{uuid.uuid4().hex[:24]}")
    return status, body.model_dump()


def event(payload: BaseModel | dict[str, Any]) -> bytes:
    """One named SSE event; its name is the payload's `type`."""
    data = payload if isinstance(payload, dict) else payload.model_dump(mode="json")
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


PING = event({"type": "ping"})


# --------------------------------------------------------------------------------- whole replies

def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str) -> str:
    """Anthropic's id for one of our calls (call_<hex> -> toolu_<hex>)."""
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:  # cut off by max_tokens: the call is not whole
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(finished: Finished | None, req: a.MessageCreateRequest,
                reader: ReplyReader | None) -> tuple[a.StopReason, str | None]:
    """Anthropic's stop_reason and stop_sequence for how a generation ended."""
    if finished is None or finished.finish_reason == "length":
        return "max_tokens", None
    if finished.stop_word and finished.stop_word in (req.stop_sequences or []):
        return "stop_sequence", finished.stop_word
    if reader is not None and reader.has_calls:
        return "tool_use", None
    return "end_turn", None


def usage(plan: Plan, output_tokens: int, cached: int) -> a.Usage:
    return a.Usage(input_tokens=plan.prompt_tokens - cached, output_tokens=output_tokens,
                   cache_read_input_tokens=cached)


def message(served: GenerativeModel, alias: str, req: a.MessageCreateRequest, plan: Plan,
            results: list[ChoiceResult]) -> a.Message:
    result = results[0]  # one choice: Anthropic has no `n`
    content: list[a.ContentBlock] = []
    reader = plan.reader()
    if reader is None:
        content.append(a.TextBlock(text=result.text))
    else:
        reader.push(result.text)
        reader.finish()
        reply = reader.message()
        if reply.reasoning_content:
            content.append(a.ThinkingBlock(thinking=reply.reasoning_content))
        if reply.content and (reply.content.strip() or not reply.tool_calls):
            content.append(a.TextBlock(text=reply.content))
        for call in reply.tool_calls or []:
            content.append(a.ToolUseBlock(id=tool_use_id(call.id), name=call.function.name,
                                          input=_input(call.function.arguments)))
        if not content:
            content.append(a.TextBlock(text=""))
    reason, sequence = stop_reason(result.finished, req, reader)
    return a.Message(id=new_message_id(), content=content, model=alias, stop_reason=reason,
                     stop_sequence=sequence,
                     usage=usage(plan, result.completion_tokens, result.cached_tokens))


# --------------------------------------------------------------------------------- streams

class _Blocks:
    """The stream's content blocks, one open at a time, indexed from 0 in order:

        closed --open(block)--> open(kind) --delta--> open(kind) --close--> closed
    """

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # the open block's type, None when none is open

    def open(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = block["type"]
        out.append(event({"type": "content_block_start", "index": self.index,
                          "content_block": block}))
        return out

    def delta(self, kind: str, delta: dict[str, Any], start: dict[str, Any]) -> list[bytes]:
        """`delta` in the open block of `kind`, opening `start` first if another is open."""
        out = self.open(start) if self.kind != kind else []
        out.append(event({"type": "content_block_delta", "index": self.index, "delta": delta}))
        return out

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [event({"type": "content_block_stop", "index": self.index})]


def _reader_events(blocks: _Blocks, delta: ChoiceDelta) -> list[bytes]:
    out: list[bytes] = []
    if delta.reasoning_content:
        out += blocks.delta("thinking", {"type": "thinking_delta",
                                         "thinking": delta.reasoning_content},
                            {"type": "thinking", "thinking": "", "signature": ""})
    if delta.content:
        out += blocks.delta("text", {"type": "text_delta", "text": delta.content},
                            {"type": "text", "text": ""})
    for call in delta.tool_calls or []:
        if call.id is not None and call.function is not None:  # a call's first delta
            out += blocks.open({"type": "tool_use", "id": tool_use_id(call.id),
                                "name": call.function.name, "input": {}})
        elif call.function is not None and call.function.arguments:
            out.append(event({"type": "content_block_delta", "index": blocks.index,
                              "delta": {"type": "input_json_delta",
                                        "partial_json": call.function.arguments}}))
    return out


async def message_events(served: GenerativeModel, alias: str, req: a.MessageCreateRequest,
                         plan: Plan) -> AsyncIterator[bytes]:
    start = a.Message(id=new_message_id(), content=[], model=alias, stop_reason=None,
                      usage=a.Usage(input_tokens=plan.prompt_tokens, output_tokens=0))
    yield event({"type": "message_start", "message": start.model_dump(mode="json")})
    yield PING
    blocks = _Blocks()
    reader = plan.reader()
    finished: Finished | None = None
    async with contextlib.aclosing(choice_events(plan.submitted)) as events:
        async for _, item in events:
            if isinstance(item, PromptProgress):
                yield PING  # keeps proxies and clients waiting through a long prompt
            elif isinstance(item, TextDelta):
                if reader is None:
                    for out in blocks.delta("text", {"type": "text_delta", "text": item.text},
                                            {"type": "text", "text": ""}):
                        yield out
                else:
                    for delta in reader.push(item.text):
                        for out in _reader_events(blocks, delta):
                            yield out
            else:
                finished = item
                for delta in reader.finish() if reader is not None else []:
                    for out in _reader_events(blocks, delta):
                        yield out
    if blocks.index < 0:  # an empty reply is still one (empty) text block
        for out in blocks.open({"type": "text", "text": ""}):
            yield out
    for out in blocks.close():
        yield out
    reason, sequence = stop_reason(finished, req, reader)
    cached = finished.cached_tokens if finished else 0
    spent = usage(plan, finished.completion_tokens if finished else 0, cached)
    yield event({"type": "message_delta",
                 "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": spent.model_dump(mode="json")})
    yield event({"type": "message_stop"})


# --------------------------------------------------------------------------------- the wire

async def plan_messages(served: GenerativeModel, lease: Lease, req: a.MessageCreateRequest,
                        limits: LimitSettings) -> Plan:
    chat = with_defaults(anthropic_request.chat_request(req), lease, served)
    return await serving.plan_chat(served, chat, limits,
                                   image_params=anthropic_request.image_params(req))


class MessagesWire:
    """POST /v1/messages."""

    plan = staticmethod(plan_messages)
    whole = staticmethod(message)
    chunks = staticmethod(message_events)
    framing = SSE_EVENTS  # named events; message_stop ends the stream, no [DONE]

    def error(self, error: APIError) -> bytes:
        return event(error_shape(error)[1])


MESSAGES = MessagesWire()
