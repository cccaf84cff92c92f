"""OpenAI's chat completions and completions as wires of the one pipeline (gateway/api/pipeline.py):
the plan fills what the request left out (gateway/generation/defaults.py) and plans it
(gateway/generation/serving.py); the renderers turn collected choices into one reply, or the
submitted generations' events into stream chunks (plain text chunks as their SSE bytes already,
filled into a template: they are most of a stream).
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from gateway import protocol as p
from gateway.api import llama_telemetry
from gateway.config import LimitSettings
from gateway.errors import APIError
from gateway.fleet.registry import Lease
from gateway.generation import defaults, reasoning, serving
from gateway.generation.choices import ChoiceResult, choice_events
from gateway.generation.events import Finished, PromptProgress, TextDelta, Timings, TokenInfo
from gateway.generation.model import GenerativeModel
from gateway.generation.serving import Plan
from gateway.generation.tool_stream import finish_reason
from gateway.http.streaming import SSE, TextEventTemplate, openai_error

R = TypeVar("R", p.ChatCompletionRequest, p.CompletionRequest)


def with_defaults(req: R, lease: Lease, served: GenerativeModel) -> R:
    """`req` with the sampling fields and budget it left out taken from the entry, the GGUF or
    llama.cpp's defaults (gateway/generation/defaults.py)."""
    budget = (defaults.chat_max_tokens(lease.entry, served.n_ctx)
              if isinstance(req, p.ChatCompletionRequest)
              else defaults.completion_max_tokens(lease.entry))
    filled = defaults.fill(req, lease.entry, served.sampling_defaults, budget)
    if isinstance(filled, p.ChatCompletionRequest):
        return reasoning.with_entry_defaults(filled, lease.entry)
    return filled


def _cached_tokens(plan: Plan, results: list[ChoiceResult]) -> int:
    """Prompt tokens served from cache, billed once per prompt: of the n choices of a prompt,
    the one that read it itself reused the least."""
    per_prompt: dict[int, int] = {}
    for prompt, r in zip(plan.prompt_of, results):
        per_prompt[prompt] = min(per_prompt.get(prompt, r.cached_tokens), r.cached_tokens)
    return sum(per_prompt.values())


def _usage(plan: Plan, results: list[ChoiceResult]) -> p.Usage:
    completion_tokens = sum(r.completion_tokens for r in results)
    return p.Usage(prompt_tokens=plan.prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=plan.prompt_tokens + completion_tokens,
                   prompt_tokens_details=p.PromptTokensDetails(
                       cached_tokens=_cached_tokens(plan, results)))


def _progress(event: PromptProgress) -> p.PromptProgress:
    return p.PromptProgress(**llama_telemetry.prompt_progress(event))


def _timings(timings: Timings | None) -> dict[str, Any] | None:
    return None if timings is None else llama_telemetry.timings(timings)


def _last_timings(req: p.GenerationRequestBody, done: Finished) -> Timings | None:
    """With timings_per_token, a choice's finishing chunk carries its timings, unless a usage
    chunk follows (llama-server puts them on the stream's last chunk)."""
    return done.timings if req.timings_per_token and not req.include_usage_in_stream() else None


def _usage_timings(req: p.GenerationRequestBody, results: list[ChoiceResult]) -> Timings | None:
    done = [r.finished for r in results if r.finished is not None]
    return done[-1].timings if req.timings_per_token and done else None


# --------------------------------------------------------------------------------- logprobs shapes

def _chat_logprobs(tokens: list[TokenInfo]) -> p.ChoiceLogprobs:
    return p.ChoiceLogprobs(content=[
        p.TokenLogprob(token=t.text, logprob=t.logprob, bytes=list(t.bytes), top_logprobs=[
            p.TopLogprob(token=text, logprob=lp, bytes=list(raw)) for text, raw, lp in t.top])
        for t in tokens
    ])


def _completion_logprobs(tokens: list[TokenInfo], offset: int) -> p.CompletionLogprobs:
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.text)
    return p.CompletionLogprobs(
        text_offset=offsets,
        token_logprobs=[t.logprob for t in tokens],
        tokens=[t.text for t in tokens],
        top_logprobs=[{text: lp for text, _, lp in t.top} for t in tokens],
    )


# --------------------------------------------------------------------------------- chat

def chat_completion(served: GenerativeModel, alias: str, req: p.ChatCompletionRequest,
                    plan: Plan, results: list[ChoiceResult]) -> p.ChatCompletion:
    choices = []
    for index, r in enumerate(results):
        message, reason = p.AssistantMessage(content=r.text), r.finish_reason
        reader = plan.reader()
        if reader is not None:
            reader.push(r.text)
            reader.finish()
            message, reason = reader.message(), finish_reason(r.finish_reason, reader)
        choices.append(p.ChatChoice(
            index=index, message=message,
            logprobs=_chat_logprobs(r.tokens) if req.logprobs else None,
            finish_reason=reason,
        ))
    return p.ChatCompletion(id=p.new_id("chatcmpl"), created=p.now(), model=alias, choices=choices,
                            usage=_usage(plan, results), system_fingerprint=served.fingerprint)


async def chat_chunks(served: GenerativeModel, alias: str, req: p.ChatCompletionRequest,
                      plan: Plan) -> AsyncIterator[p.ChatCompletionChunk | bytes]:
    cid, created = p.new_id("chatcmpl"), p.now()

    def chunk(index: int, delta: p.ChoiceDelta, logprobs: p.ChoiceLogprobs | None = None,
              finish: str | None = None, progress: p.PromptProgress | None = None,
              timings: Timings | None = None) -> p.ChatCompletionChunk:
        choice = p.ChunkChoice(index=index, delta=delta, logprobs=logprobs,
                               finish_reason=finish)
        return p.ChatCompletionChunk(id=cid, created=created, model=alias, choices=[choice],
                                     prompt_progress=progress, timings=_timings(timings),
                                     system_fingerprint=served.fingerprint)

    text_event = TextEventTemplate(chunk(TextEventTemplate.INDEX,
                                         p.ChoiceDelta(content=TextEventTemplate.TEXT)))
    for index in range(len(plan.requests)):
        yield chunk(index, p.ChoiceDelta(role="assistant", content=""))
    results = [ChoiceResult() for _ in plan.requests]  # only what usage needs
    readers = [plan.reader() for _ in plan.requests]
    async with contextlib.aclosing(choice_events(plan.submitted)) as events:
        async for index, event in events:
            reader = readers[index]
            if isinstance(event, PromptProgress):
                yield chunk(index, p.ChoiceDelta(), progress=_progress(event))
            elif reader is not None:  # tool calls possible: deltas as the reader finds them
                if isinstance(event, TextDelta):
                    deltas = reader.push(event.text)
                    if req.logprobs and not deltas:  # held-back text: its tokens' logprobs now
                        deltas = [p.ChoiceDelta()]
                else:
                    deltas = reader.finish()
                for n, delta in enumerate(deltas):
                    logprobs = _chat_logprobs(event.tokens) if (
                        req.logprobs and n == 0 and isinstance(event, TextDelta)) else None
                    timed = (event.timings if isinstance(event, TextDelta)
                             and n == len(deltas) - 1 else None)
                    yield chunk(index, delta, logprobs, timings=timed)
                if isinstance(event, Finished):
                    results[index].finish(event)
                    yield chunk(index, p.ChoiceDelta(),
                                finish=finish_reason(event.finish_reason, reader),
                                timings=_last_timings(req, event))
            elif isinstance(event, TextDelta):
                if req.logprobs or event.timings is not None:
                    yield chunk(index, p.ChoiceDelta(content=event.text),
                                _chat_logprobs(event.tokens) if req.logprobs else None,
                                timings=event.timings)
                else:
                    yield text_event.event(index, event.text)
            else:
                results[index].finish(event)
                yield chunk(index, p.ChoiceDelta(), finish=event.finish_reason,
                            timings=_last_timings(req, event))
    if req.include_usage_in_stream():
        yield p.ChatCompletionChunk(id=cid, created=created, model=alias, choices=[],
                                    usage=_usage(plan, results),
                                    timings=_timings(_usage_timings(req, results)),
                                    system_fingerprint=served.fingerprint)


# --------------------------------------------------------------------------------- completions

def completion(served: GenerativeModel, alias: str, req: p.CompletionRequest,
               plan: Plan, results: list[ChoiceResult]) -> p.Completion:
    choices = [p.CompletionChoice(
        index=index, text=echo + r.text,
        logprobs=_completion_logprobs(r.tokens, 0) if req.wants_logprobs() else None,
        finish_reason=r.finish_reason,
    ) for index, (r, echo) in enumerate(zip(results, plan.echo))]
    return p.Completion(id=p.new_id("cmpl"), created=p.now(), model=alias, choices=choices,
                        usage=_usage(plan, results), system_fingerprint=served.fingerprint)


async def completion_chunks(served: GenerativeModel, alias: str, req: p.CompletionRequest,
                            plan: Plan) -> AsyncIterator[p.Completion | bytes]:
    cid, created = p.new_id("cmpl"), p.now()

    def chunk(index: int, text: str, logprobs: p.CompletionLogprobs | None = None,
              finish: str | None = None, progress: p.PromptProgress | None = None,
              timings: Timings | None = None) -> p.Completion:
        choice = p.CompletionChoice(index=index, text=text, logprobs=logprobs,
                                    finish_reason=finish)
        return p.Completion(id=cid, created=created, model=alias, choices=[choice],
                            prompt_progress=progress, timings=_timings(timings),
                            system_fingerprint=served.fingerprint)

    text_event = TextEventTemplate(chunk(TextEventTemplate.INDEX, TextEventTemplate.TEXT))
    for index, echo in enumerate(plan.echo):
        if echo:
            yield chunk(index, echo)
    results = [ChoiceResult() for _ in plan.requests]  # only what usage needs
    offsets = [0] * len(plan.requests)
    async with contextlib.aclosing(choice_events(plan.submitted)) as events:
        async for index, event in events:
            if isinstance(event, PromptProgress):
                yield chunk(index, "", progress=_progress(event))
            elif isinstance(event, TextDelta):
                if req.wants_logprobs():
                    logprobs = _completion_logprobs(event.tokens, offsets[index])
                    offsets[index] += sum(len(t.text) for t in event.tokens)
                    yield chunk(index, event.text, logprobs, timings=event.timings)
                elif event.timings is not None:
                    yield chunk(index, event.text, timings=event.timings)
                else:
                    yield text_event.event(index, event.text)
            else:
                results[index].finish(event)
                yield chunk(index, "", finish=event.finish_reason,
                            timings=_last_timings(req, event))
    if req.include_usage_in_stream():
        yield p.Completion(id=cid, created=created, model=alias, choices=[],
                           usage=_usage(plan, results),
                           timings=_timings(_usage_timings(req, results)),
                           system_fingerprint=served.fingerprint)



# --------------------------------------------------------------------------------- the wires

class ChatWire:
    """POST /v1/chat/completions."""

    async def plan(self, model: GenerativeModel, lease: Lease, req: p.ChatCompletionRequest,
                   limits: LimitSettings) -> Plan:
        return await serving.plan_chat(model, with_defaults(req, lease, model), limits,
                                       lease.entry.reasoning_field)

    framing = SSE
    whole = staticmethod(chat_completion)
    chunks = staticmethod(chat_chunks)


    def error(self, error: APIError) -> dict[str, Any]:
        return openai_error(error)


class CompletionWire:
    """POST /v1/completions."""

    async def plan(self, model: GenerativeModel, lease: Lease, req: p.CompletionRequest,
                   limits: LimitSettings) -> Plan:
        return await serving.plan_completion(model, with_defaults(req, lease, model), limits)

    framing = SSE
    whole = staticmethod(completion)
    chunks = staticmethod(completion_chunks)


    def error(self, error: APIError) -> dict[str, Any]:
        return openai_error(error)


CHAT = ChatWire()
COMPLETION = CompletionWire()
