"""One validated OpenAI request -> generation requests -> OpenAI response objects.

Planning (template, tokenizing, context check) happens before anything is sent, so its errors are
proper 400s. It is CPU work, so it runs in the model's `prep` threads, never on the event loop,
within `limits`: the template has a time budget and an output cap, and a prompt too long to
fit the context is refused before it is tokenized. Running yields protocol objects, either one
whole response or stream chunks (plain text chunks come as their SSE bytes already, filled into
a template: they are most of a stream).
Choices (`n`, several prompts) are submitted together and run side by side in the model's batch;
the n choices of a prompt share its token list, so the scheduler reads the prompt once. If the
consumer leaves, every choice is cancelled.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from gateway import protocol as p
from gateway.config import LimitSettings
from gateway.errors import APIError, context_length_exceeded, invalid_request
from gateway.generation.events import (
    Event,
    Finished,
    GenerationObserver,
    GenerationRequest,
    PromptProgress,
    TextDelta,
    TokenInfo,
)
from gateway.generation.model import GenerativeModel
from gateway.generation.structured import Output, chat_output, completion_output
from gateway.generation.tool_stream import ReplyReader, finish_reason
from gateway.http.streaming import TextEventTemplate
from gateway.metrics import RequestMetrics

T = TypeVar("T")
DEFAULT_LIMITS = LimitSettings()


@dataclass
class Plan:
    """Generation requests in choice order and the prompt tokens they bill once."""
    requests: list[GenerationRequest]
    prompt_tokens: int
    echo: list[str] = field(default_factory=list)  # completions with echo: text before each choice
    prompt_of: list[int] = field(default_factory=list)  # per choice: which prompt it continues
    submitted: list[Any] = field(default_factory=list)  # the generations, once submitted
    output: Output = field(default_factory=Output)       # the grammar, the tool-call format

    async def prepare(self, served: GenerativeModel) -> None:
        """Compile the grammar (on a worker thread; a 400 if it does not compile) and give each
        choice its own copy. Call before submit()."""
        constraint = await self.output.compile(served.tokenizer)
        if constraint is None:
            return
        keep = self.output.tool_format is not None and (
            self.output.tool_format.special(self.output.tool_format.marker) is not None)
        self.requests = [dataclasses.replace(r, constraint=constraint.copy(), keep_special=keep)
                         for r in self.requests]

    def observe(self, observer: GenerationObserver) -> None:
        """Have `observer` told every event of every choice (the request's metrics)."""
        self.requests = [dataclasses.replace(r, observer=observer) for r in self.requests]

    def reader(self) -> ReplyReader | None:
        """A fresh reader for one choice's reply when it may hold tool calls."""
        fmt = self.output.tool_format
        return ReplyReader(fmt) if fmt is not None else None

    def submit(self, served: GenerativeModel) -> None:
        """Queue every choice at once (they share the batch); all or none. Streams call it before
        the headers go out, so a full queue is a 503; cancel() undoes it if the stream never runs."""
        generations: list[Any] = []
        try:
            for request in self.requests:
                generations.append(served.submit(request))
        except BaseException:
            for generation in generations:
                generation.cancel()
            raise
        self.submitted = generations

    def cancel(self) -> None:
        for generation in self.submitted:
            generation.cancel()


@dataclass
class ChoiceResult:
    text: str = ""
    tokens: list[TokenInfo] = field(default_factory=list)
    finish_reason: str = "length"
    completion_tokens: int = 0
    cached_tokens: int = 0

    def finish(self, event: Finished) -> None:
        self.finish_reason = event.finish_reason
        self.completion_tokens = event.completion_tokens
        self.cached_tokens = event.cached_tokens


def _check_logit_bias(served: GenerativeModel, bias: dict[str, float] | None) -> None:
    n_vocab = served.n_vocab
    for key in bias or {}:
        if int(key) >= n_vocab:
            raise invalid_request(f"logit_bias token {key} is outside the vocabulary (0..{n_vocab - 1})",
                                  "logit_bias")


def _generation(served: GenerativeModel, req: p.GenerationRequestBody, ids: list[int], choice: int,
                param: str) -> GenerationRequest:
    if len(ids) >= served.n_ctx:
        raise context_length_exceeded(len(ids), served.n_ctx, param)
    room = served.n_ctx - len(ids)
    budget = req.token_budget()
    return GenerationRequest(
        prompt_ids=ids,
        params=p.sampling_params(req, choice),
        max_tokens=room if budget is None else min(budget, room),
        stop=tuple(req.stop_list()),
        logprobs=req.wants_logprobs(),
    )


async def off_loop(served: GenerativeModel, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn` in the model's prep threads (template rendering and tokenizing are CPU work)."""
    return await served.prepare(fn, *args)


def check_prompt_size(served: GenerativeModel, text: str, limits: LimitSettings, param: str,
                      fits_context: bool = True) -> None:
    """Refuse text that cannot fit before spending time on it: over limits.max_prompt is a 413;
    with `fits_context`, more bytes than n_ctx of the model's longest token could hold cannot
    fit the context (a 400, as the tokenized prompt would get)."""
    if len(text) > limits.max_prompt:
        raise APIError(413, f"The prompt has {len(text)} characters; this server accepts at most "
                            f"{limits.max_prompt} (limits.max_prompt)", param=param,
                       code="prompt_too_large")
    if fits_context:
        n_bytes = len(text.encode("utf-8", errors="surrogatepass"))
        at_least = -(-n_bytes // served.max_token_bytes)  # tokens: none holds more bytes
        if at_least > served.n_ctx:
            raise context_length_exceeded(at_least, served.n_ctx, param)


def tokenize_prompt(served: GenerativeModel, text: str, limits: LimitSettings, param: str) -> list[int]:
    """A prompt's tokens, after check_prompt_size."""
    check_prompt_size(served, text, limits, param)
    return served.text_prompt(text)


def _chat_ids(served: GenerativeModel, output: Output, limits: LimitSettings) -> list[int]:
    text = served.chat_template.render(output.messages, add_generation_prompt=True,
                                       tools=output.template_tools,
                                       time_budget=limits.template_timeout,
                                       max_chars=limits.max_prompt)
    return tokenize_prompt(served, text, limits, "messages")


async def plan_chat(served: GenerativeModel, req: p.ChatCompletionRequest,
                    limits: LimitSettings = DEFAULT_LIMITS) -> Plan:
    _check_logit_bias(served, req.logit_bias)
    output = chat_output(req, served.tool_format)
    ids = await off_loop(served, _chat_ids, served, output, limits)
    return Plan([_generation(served, req, ids, i, "messages") for i in range(req.n)], len(ids),
                prompt_of=[0] * req.n, output=output)


async def plan_completion(served: GenerativeModel, req: p.CompletionRequest,
                          limits: LimitSettings = DEFAULT_LIMITS) -> Plan:
    _check_logit_bias(served, req.logit_bias)
    return await off_loop(served, _plan_completion, served, req, limits)


def _plan_completion(served: GenerativeModel, req: p.CompletionRequest, limits: LimitSettings) -> Plan:
    if req.echo and req.logprobs is not None:
        raise invalid_request("echo together with logprobs is not supported", "echo")
    n_vocab = served.n_vocab
    requests: list[GenerationRequest] = []
    echo: list[str] = []
    prompt_of: list[int] = []
    total = 0
    for number, prompt in enumerate(req.prompts()):
        if isinstance(prompt, str):
            ids = tokenize_prompt(served, prompt, limits, "prompt")
            text = prompt
        else:
            if any(not 0 <= t < n_vocab for t in prompt):
                raise invalid_request(f"prompt token ids must be in 0..{n_vocab - 1}", "prompt")
            ids = list(prompt)
            text = served.tokenizer.decode(ids)
        if not ids:
            raise invalid_request("prompt is empty after tokenizing", "prompt")
        total += len(ids)
        for i in range(req.n):
            requests.append(_generation(served, req, ids, i, "prompt"))
            echo.append(text if req.echo else "")
            prompt_of.append(number)
    return Plan(requests, total, echo, prompt_of, output=completion_output(req))


async def _events(generations: list[Any]) -> AsyncGenerator[tuple[int, Event], None]:
    """Yield (choice index, event) as the submitted choices' events arrive. Leaving early, or an
    error in any choice, cancels all of them."""
    pumps: list[asyncio.Task[None]] = []
    merged: asyncio.Queue[tuple[int, Event | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, generation: Any) -> None:
        try:
            async for event in generation:
                merged.put_nowait((index, event))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            merged.put_nowait((index, exc))
        finally:
            merged.put_nowait((index, None))

    try:
        if len(generations) == 1:  # the usual case: no pump task, one loop round less per token
            async for event in generations[0]:
                yield 0, event
            return
        pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(generations)]
        running = len(pumps)
        while running:
            index, event = await merged.get()
            if event is None:
                running -= 1
            elif isinstance(event, BaseException):
                raise event
            else:
                yield index, event
    finally:
        for pumping in pumps:
            pumping.cancel()
        for generation in generations:
            generation.cancel()


async def _collect(served: GenerativeModel, plan: Plan) -> list[ChoiceResult]:
    results = [ChoiceResult() for _ in plan.requests]
    parts: list[list[str]] = [[] for _ in plan.requests]
    plan.submit(served)
    async with contextlib.aclosing(_events(plan.submitted)) as events:
        async for index, event in events:
            result = results[index]
            if isinstance(event, TextDelta):
                parts[index].append(event.text)
                result.tokens.extend(event.tokens)
            elif isinstance(event, Finished):
                result.finish(event)
    for result, texts in zip(results, parts):
        result.text = "".join(texts)
    return results


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
    return p.PromptProgress(processed=event.processed, total=event.total, cached=event.cached)


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

async def chat_completion(served: GenerativeModel, alias: str, req: p.ChatCompletionRequest,
                          plan: Plan) -> p.ChatCompletion:
    results = await _collect(served, plan)
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
              finish: str | None = None,
              progress: p.PromptProgress | None = None) -> p.ChatCompletionChunk:
        choice = p.ChunkChoice(index=index, delta=delta, logprobs=logprobs,
                               finish_reason=finish)
        return p.ChatCompletionChunk(id=cid, created=created, model=alias, choices=[choice],
                                     prompt_progress=progress,
                                     system_fingerprint=served.fingerprint)

    text_event = TextEventTemplate(chunk(TextEventTemplate.INDEX,
                                         p.ChoiceDelta(content=TextEventTemplate.TEXT)))
    for index in range(len(plan.requests)):
        yield chunk(index, p.ChoiceDelta(role="assistant", content=""))
    results = [ChoiceResult() for _ in plan.requests]  # only what usage needs
    readers = [plan.reader() for _ in plan.requests]
    async with contextlib.aclosing(_events(plan.submitted)) as events:
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
                    yield chunk(index, delta, logprobs)
                if isinstance(event, Finished):
                    results[index].finish(event)
                    yield chunk(index, p.ChoiceDelta(),
                                finish=finish_reason(event.finish_reason, reader))
            elif isinstance(event, TextDelta):
                if req.logprobs:
                    yield chunk(index, p.ChoiceDelta(content=event.text), _chat_logprobs(event.tokens))
                else:
                    yield text_event.event(index, event.text)
            else:
                results[index].finish(event)
                yield chunk(index, p.ChoiceDelta(), finish=event.finish_reason)
    if req.include_usage_in_stream():
        yield p.ChatCompletionChunk(id=cid, created=created, model=alias, choices=[],
                                    usage=_usage(plan, results),
                                    system_fingerprint=served.fingerprint)


# --------------------------------------------------------------------------------- completions

async def completion(served: GenerativeModel, alias: str, req: p.CompletionRequest,
                     plan: Plan) -> p.Completion:
    results = await _collect(served, plan)
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
              finish: str | None = None, progress: p.PromptProgress | None = None) -> p.Completion:
        choice = p.CompletionChoice(index=index, text=text, logprobs=logprobs,
                                    finish_reason=finish)
        return p.Completion(id=cid, created=created, model=alias, choices=[choice],
                            prompt_progress=progress, system_fingerprint=served.fingerprint)

    text_event = TextEventTemplate(chunk(TextEventTemplate.INDEX, TextEventTemplate.TEXT))
    for index, echo in enumerate(plan.echo):
        if echo:
            yield chunk(index, echo)
    results = [ChoiceResult() for _ in plan.requests]  # only what usage needs
    offsets = [0] * len(plan.requests)
    async with contextlib.aclosing(_events(plan.submitted)) as events:
        async for index, event in events:
            if isinstance(event, PromptProgress):
                yield chunk(index, "", progress=_progress(event))
            elif isinstance(event, TextDelta):
                if req.wants_logprobs():
                    logprobs = _completion_logprobs(event.tokens, offsets[index])
                    offsets[index] += sum(len(t.text) for t in event.tokens)
                    yield chunk(index, event.text, logprobs)
                else:
                    yield text_event.event(index, event.text)
            else:
                results[index].finish(event)
                yield chunk(index, "", finish=event.finish_reason)
    if req.include_usage_in_stream():
        yield p.Completion(id=cid, created=created, model=alias, choices=[],
                           usage=_usage(plan, results), system_fingerprint=served.fingerprint)


# --------------------------------------------------------------------------------- embeddings

async def embeddings(served: GenerativeModel, alias: str, req: p.EmbeddingRequest,
                     limits: LimitSettings = DEFAULT_LIMITS,
                     metrics: RequestMetrics | None = None) -> p.EmbeddingList:
    n_embd = served.n_embd
    if req.dimensions is not None and req.dimensions != n_embd:
        raise invalid_request(f"this model's embeddings have {n_embd} dimensions", "dimensions")
    prompts = await off_loop(served, _embedding_inputs, served, req, limits)
    data = []
    for index, ids in enumerate(prompts):
        vector = await served.embed(ids)  # float32 [n_embd]
        if metrics is not None:
            metrics.embedded(len(ids))
        value: list[float] | str
        if req.encoding_format == "base64":
            value = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        else:
            value = [float(x) for x in vector]
        data.append(p.Embedding(index=index, embedding=value))
    total = sum(len(ids) for ids in prompts)
    return p.EmbeddingList(data=data, model=alias,
                           usage=p.EmbeddingUsage(prompt_tokens=total, total_tokens=total))


def _embedding_inputs(served: GenerativeModel, req: p.EmbeddingRequest,
                      limits: LimitSettings) -> list[list[int]]:
    n_vocab = served.n_vocab
    prompts: list[list[int]] = []
    for item in req.inputs():
        ids = tokenize_prompt(served, item, limits, "input") if isinstance(item, str) else list(item)
        if not ids:
            raise invalid_request("input is empty after tokenizing", "input")
        if any(not 0 <= t < n_vocab for t in ids):
            raise invalid_request(f"input token ids must be in 0..{n_vocab - 1}", "input")
        if len(ids) > served.n_ctx:
            raise context_length_exceeded(len(ids), served.n_ctx, "input")
        prompts.append(ids)
    return prompts
