"""Ollama's /api/chat and /api/generate as wires of the one pipeline (gateway/api/pipeline.py).

A request is translated into the OpenAI request it means (gateway/protocol/ollama.py ->
gateway/protocol/chat.py), so chat templates, tools, `format` (structured output) and the
sampling defaults are the same machinery /v1 uses; /api/generate with `raw` is a plain
completion. The renderers give Ollama's shapes: NDJSON objects with `done: false` per piece,
then one `done: true` object with the counts and durations (nanoseconds).

    think      the model's format reads a <think> span: it is returned as `thinking`, never in
               `content`. `think` on a model without one is a 400 (as Ollama); false turns it
               off, a level ("low".."high") turns it on at that reasoning_effort
               (gateway/generation/reasoning.py).
    options    num_predict, temperature, top_k, top_p, min_p, seed, stop and the penalties;
               num_ctx must be the entry's n_ctx (a different one would mean a reload).
    images     base64 strings, each a chat image_url part (a data: URL; the decoder reads the
               format from the bytes) before the message's text, where Ollama puts its
               [img-n] tags; image_params() names them (messages[i].images[k]) for errors.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from gateway import protocol as p
from gateway.config import LimitSettings
from gateway.errors import APIError, invalid_request
from gateway.fleet.registry import Lease
from gateway.generation import defaults, reasoning, serving
from gateway.generation.choices import ChoiceResult, choice_events
from gateway.generation.events import Finished, PromptProgress, TokenInfo
from gateway.generation.model import GenerativeModel
from gateway.generation.serving import Plan
from gateway.generation.tool_stream import ReplyReader
from gateway.http.streaming import NDJSON
from gateway.protocol import ollama as o

R = TypeVar("R", p.ChatCompletionRequest, p.CompletionRequest)
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
             "frequency_penalty", "seed")


def ollama_name(alias: str) -> str:
    """The name Ollama's clients see: `name:tag`, `latest` when the alias has no tag."""
    return alias if ":" in alias else f"{alias}:latest"


def created_at() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class OllamaPlan(Plan):
    started: float = 0.0      # perf_counter when planning began: total_duration counts from it
    generate: bool = False    # /api/generate's shape (`response`) rather than chat's (`message`)


def _ollama_plan(plan: Plan, generate: bool, started: float) -> OllamaPlan:
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    return OllamaPlan(**fields, started=started, generate=generate)


# --------------------------------------------------------------------------------- requests

def _sampling(options: o.Options | None, n_ctx: int) -> dict[str, Any]:
    """`options` as OpenAI request fields; a 400 for what this server cannot honour."""
    if options is None:
        return {}
    if options.num_ctx is not None and options.num_ctx != n_ctx:
        raise invalid_request(f"options.num_ctx is {options.num_ctx}, but this model is served "
                              f"with a context of {n_ctx} tokens; the config file sets it "
                              f"(n_ctx), so send {n_ctx} or leave num_ctx out", "options.num_ctx")
    if options.mirostat not in (None, 0):
        raise invalid_request("options.mirostat is not supported by this server",
                              "options.mirostat")
    if options.typical_p not in (None, 1.0):
        raise invalid_request("options.typical_p is not supported by this server",
                              "options.typical_p")
    out = {name: getattr(options, name) for name in _SAMPLING if getattr(options, name) is not None}
    if options.num_predict is not None and options.num_predict > 0:
        out["max_tokens"] = options.num_predict
    if options.stop:
        out["stop"] = options.stop
    return out


def _format(fmt: o.Format | None) -> dict[str, Any]:
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    assert isinstance(fmt, dict)
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "format", "schema": fmt}}}


def _common(req: o.ChatRequest | o.GenerateRequest, n_ctx: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": req.model, "stream": req.stream,
                              **_sampling(req.options, n_ctx), **_format(req.format)}
    if req.logprobs:
        fields["logprobs"] = True
        if not isinstance(req, o.GenerateRequest):
            fields["top_logprobs"] = req.top_logprobs or 0
    return fields


def _check_think(think: o.Think | None, model: GenerativeModel, name: str) -> None:
    if think not in (None, False) and not model.tool_format.thinking:
        raise invalid_request(f'"{name}" does not support thinking', "think")


def _think(think: o.Think | None) -> dict[str, Any]:
    """`think` as the chat twin's reasoning fields."""
    if think is None:
        return {}
    out: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": think is not False}}
    if isinstance(think, str):
        out["reasoning_effort"] = think
    return out


def _content(text: str, images: list[str] | None) -> str | list[dict[str, Any]]:
    """The text alone, or chat's parts: the images first, then the text."""
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": f"data:;base64,{b64}"}}
                                   for b64 in images]
    return [*parts, {"type": "text", "text": text}] if text else parts


def image_params(req: o.ChatRequest | o.GenerateRequest) -> list[str]:
    """Where each image of the translated request was, in order."""
    if isinstance(req, o.GenerateRequest):
        return [f"images[{k}]" for k in range(len(req.images or []))]
    return [f"messages[{i}].images[{k}]" for i, m in enumerate(req.messages)
            for k in range(len(m.images or []))]


def _messages(req: o.ChatRequest) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's: a call gets an id, a tool result answers the earliest
    unanswered call of its tool (`tool_name`), else the earliest unanswered call."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, tool name), unanswered
    for i, m in enumerate(req.messages):
        message: dict[str, Any] = {"role": m.role, "content": _content(m.content, m.images)}
        if m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                call_id = f"call_{i}_{j}"
                pending.append((call_id, call.function.name))
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": call.function.name, "arguments": json.dumps(call.function.arguments)}})
            message["tool_calls"] = calls
        if m.role == "tool":
            match = next((c for c in pending if c[1] == m.tool_name), pending[0] if pending else None)
            if match is None:
                raise invalid_request(f"messages[{i}]: a tool message answers no earlier tool call",
                                      f"messages[{i}]")
            pending.remove(match)
            message["tool_call_id"] = match[0]
        out.append(message)
    return out


def _parsed(model: type[R], body: dict[str, Any]) -> R:
    """The OpenAI request `body` means, checked by its parser (a 400 naming the field)."""
    return p.parse_request(model, json.dumps(body).encode())


def chat_request(req: o.ChatRequest, n_ctx: int) -> p.ChatCompletionRequest:
    body = {**_common(req, n_ctx), **_think(req.think), "messages": _messages(req)}
    if req.tools:
        body["tools"] = req.tools
    return _parsed(p.ChatCompletionRequest, body)


def generate_request(req: o.GenerateRequest, n_ctx: int
                     ) -> p.ChatCompletionRequest | p.CompletionRequest:
    for name in ("suffix", "template", "context"):
        if getattr(req, name) is not None:
            why = {"suffix": "fill-in-the-middle is not supported",
                   "template": "prompts use the model's own chat template (or send raw: true)",
                   "context": "send the conversation to /api/chat instead"}[name]
            raise invalid_request(f"'{name}' is not supported: {why}", name)
    if req.raw:
        if req.images:  # a raw prompt has no place marked for them
            raise invalid_request("'images' with raw: true are not supported; leave raw out",
                                  "images")
        return _parsed(p.CompletionRequest, {**_common(req, n_ctx), "prompt": req.prompt})
    messages: list[dict[str, Any]] = [{"role": "system", "content": req.system}] if req.system else []
    messages.append({"role": "user", "content": _content(req.prompt, req.images)})
    return _parsed(p.ChatCompletionRequest, {**_common(req, n_ctx), **_think(req.think),
                                             "messages": messages})


def with_defaults(req: R, lease: Lease, served: GenerativeModel) -> R:
    """As /v1/chat/completions fills them, the entry's reasoning defaults included; raw
    generate gets the chat budget too (Ollama's num_predict defaults to "until the model
    stops", never OpenAI's 16)."""
    filled = defaults.fill(req, lease.entry, served.sampling_defaults,
                           defaults.chat_max_tokens(lease.entry, served.n_ctx))
    if isinstance(filled, p.ChatCompletionRequest):
        return reasoning.with_entry_defaults(filled, lease.entry)
    return filled


# --------------------------------------------------------------------------------- replies

def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _logprobs(tokens: list[TokenInfo]) -> list[dict[str, Any]]:
    return [o.Logprob(token=t.text, logprob=t.logprob, bytes=list(t.bytes), top_logprobs=[
        o.TokenLogprob(token=text, logprob=lp, bytes=list(raw)) for text, raw, lp in t.top]
    ).model_dump() for t in tokens]


def _calls(reader: ReplyReader) -> list[o.ReplyToolCall]:
    out = []
    for index, call in enumerate(reader.reply.calls):
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:  # the grammar closes the object; cut short by length only
            arguments = {}
        out.append(o.ReplyToolCall(function={"index": index, "name": call.name,
                                             "arguments": arguments}))
    return out


def _object(plan: OllamaPlan, alias: str, content: str, thinking: str | None = None,
            calls: list[o.ReplyToolCall] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"model": ollama_name(alias), "created_at": created_at()}
    if plan.generate:
        out["response"] = content
        if thinking:
            out["thinking"] = thinking
    else:
        out["message"] = o.ReplyMessage(content=content, thinking=thinking or None,
                                        tool_calls=calls or None).model_dump()
    out["done"] = False
    return out


def _stats(plan: OllamaPlan, result: ChoiceResult) -> dict[str, Any]:
    ended = result.finished
    return o.Stats(
        done_reason=result.finish_reason if result.finish_reason != "tool_calls" else "stop",
        total_duration=_ns(time.perf_counter() - plan.started), load_duration=0,
        prompt_eval_count=plan.prompt_tokens,
        prompt_eval_cached_count=result.cached_tokens,
        prompt_eval_duration=_ns(ended.prompt_seconds if ended else 0.0),
        eval_count=result.completion_tokens,
        eval_duration=_ns(ended.predicted_seconds if ended else 0.0),
    ).model_dump()


def whole(served: GenerativeModel, alias: str, req: o.ChatRequest | o.GenerateRequest,
          plan: OllamaPlan, results: list[ChoiceResult]) -> dict[str, Any]:
    result = results[0]
    content, thinking, calls = result.text, None, None
    reader = plan.reader()
    if reader is not None:
        reader.push(result.text)
        reader.finish()
        content, thinking, calls = reader.reply.content, reader.reply.reasoning, _calls(reader)
    out = _object(plan, alias, content, thinking, calls)
    if req.logprobs:
        out["logprobs"] = _logprobs(result.tokens)
    out["done"] = True
    return {**out, **_stats(plan, result)}


async def chunks(served: GenerativeModel, alias: str, req: o.ChatRequest | o.GenerateRequest,
                 plan: OllamaPlan) -> AsyncIterator[dict[str, Any]]:
    """One object per piece of text (or thinking); tool calls whole in one object once the
    reply is read; then the done object."""
    reader = plan.reader()
    result = ChoiceResult()
    events = choice_events(plan.submitted)
    try:
        async for _, event in events:
            if isinstance(event, PromptProgress):
                continue
            if isinstance(event, Finished):
                result.finish(event)
                if reader is not None:
                    for out in _pieces(plan, alias, reader.finish()):
                        yield out
                    if reader.has_calls:
                        yield _object(plan, alias, "", calls=_calls(reader))
                break
            pieces = ([_object(plan, alias, event.text)] if reader is None
                      else _pieces(plan, alias, reader.push(event.text)))
            if req.logprobs:
                pieces = pieces or [_object(plan, alias, "")]
                pieces[0]["logprobs"] = _logprobs(event.tokens)
            for out in pieces:
                yield out
    finally:
        await events.aclose()
    done = _object(plan, alias, "")
    done["done"] = True
    yield {**done, **_stats(plan, result)}


def _pieces(plan: OllamaPlan, alias: str, deltas: list[p.ChoiceDelta]) -> list[dict[str, Any]]:
    return [_object(plan, alias, d.content or "", d.reasoning_content)
            for d in deltas if d.content or d.reasoning_content]


# --------------------------------------------------------------------------------- the wires

def ollama_body(error: APIError) -> dict[str, Any]:
    """Ollama's error body: the message alone (its clients raise it as ResponseError)."""
    return {"error": error.message}


def error_shape(error: APIError) -> tuple[int, dict[str, Any]]:
    """Ollama's errors keep the one mapping's status (gateway/errors.py shape_errors)."""
    return error.status, ollama_body(error)


class ChatWire:
    """POST /api/chat."""
    framing = NDJSON

    async def plan(self, model: GenerativeModel, lease: Lease, req: o.ChatRequest,
                   limits: LimitSettings) -> OllamaPlan:
        started = time.perf_counter()
        _check_think(req.think, model, req.model)
        openai = with_defaults(chat_request(req, model.n_ctx), lease, model)
        plan = await serving.plan_chat(model, openai, limits, image_params=image_params(req))
        return _ollama_plan(plan, False, started)

    whole = staticmethod(whole)
    chunks = staticmethod(chunks)

    def error(self, error: APIError) -> dict[str, Any]:
        return ollama_body(error)


class GenerateWire(ChatWire):
    """POST /api/generate."""

    async def plan(self, model: GenerativeModel, lease: Lease,  # type: ignore[override]
                   req: o.GenerateRequest, limits: LimitSettings) -> OllamaPlan:
        started = time.perf_counter()
        _check_think(req.think, model, req.model)
        openai = generate_request(req, model.n_ctx)
        if isinstance(openai, p.ChatCompletionRequest):
            plan = await serving.plan_chat(model, with_defaults(openai, lease, model), limits,
                                           image_params=image_params(req))
        else:
            plan = await serving.plan_completion(model, with_defaults(openai, lease, model),
                                                 limits)
        return _ollama_plan(plan, True, started)


CHAT = ChatWire()
GENERATE = GenerateWire()
