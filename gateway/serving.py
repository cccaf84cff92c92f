"""One validated OpenAI request -> generation requests -> OpenAI response objects.

Planning (template, tokenizing, context check) happens before anything is sent, so its errors are
proper 400s; running yields protocol objects, either one whole response or stream chunks.
Choices run one after another (`n`, several prompts); each is cancelled if its consumer leaves.
"""
from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from . import protocol as p
from .errors import context_length_exceeded, invalid_request
from .scheduler import Finished, GenerationRequest, ServedModel, TextDelta, TokenInfo


@dataclass
class Plan:
    """Generation requests in choice order and the prompt tokens they bill once."""
    requests: list[GenerationRequest]
    prompt_tokens: int
    echo: list[str] = field(default_factory=list)  # completions with echo: text before each choice


@dataclass
class ChoiceResult:
    text: str = ""
    tokens: list[TokenInfo] = field(default_factory=list)
    finish_reason: str = "length"
    completion_tokens: int = 0


def _check_logit_bias(served: ServedModel, bias: dict[str, float] | None) -> None:
    n_vocab = served.model.n_vocab
    for key in bias or {}:
        if int(key) >= n_vocab:
            raise invalid_request(f"logit_bias token {key} is outside the vocabulary (0..{n_vocab - 1})",
                                  "logit_bias")


def _generation(served: ServedModel, req: p.GenerationRequestBody, ids: list[int], choice: int,
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


def plan_chat(served: ServedModel, req: p.ChatCompletionRequest) -> Plan:
    _check_logit_bias(served, req.logit_bias)
    ids = served.chat_prompt([m.for_template() for m in req.messages])
    return Plan([_generation(served, req, ids, i, "messages") for i in range(req.n)], len(ids))


def plan_completion(served: ServedModel, req: p.CompletionRequest) -> Plan:
    _check_logit_bias(served, req.logit_bias)
    if req.echo and req.logprobs is not None:
        raise invalid_request("echo together with logprobs is not supported", "echo")
    n_vocab = served.model.n_vocab
    requests: list[GenerationRequest] = []
    echo: list[str] = []
    total = 0
    for prompt in req.prompts():
        if isinstance(prompt, str):
            ids = served.text_prompt(prompt)
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
    return Plan(requests, total, echo)


async def _collect(served: ServedModel, request: GenerationRequest) -> ChoiceResult:
    result = ChoiceResult()
    parts: list[str] = []
    async with served.scheduler.submit(request) as generation:
        async for event in generation:
            if isinstance(event, TextDelta):
                parts.append(event.text)
                result.tokens.extend(event.tokens)
            else:
                result.finish_reason = event.finish_reason
                result.completion_tokens = event.completion_tokens
    result.text = "".join(parts)
    return result


def _usage(prompt_tokens: int, completion_tokens: int) -> p.Usage:
    return p.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


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

async def chat_completion(served: ServedModel, alias: str, req: p.ChatCompletionRequest,
                          plan: Plan) -> p.ChatCompletion:
    choices = []
    completion_tokens = 0
    for index, request in enumerate(plan.requests):
        r = await _collect(served, request)
        completion_tokens += r.completion_tokens
        choices.append(p.ChatChoice(
            index=index,
            message=p.AssistantMessage(content=r.text),
            logprobs=_chat_logprobs(r.tokens) if req.logprobs else None,
            finish_reason=r.finish_reason,  # type: ignore[arg-type]
        ))
    return p.ChatCompletion(id=p.new_id("chatcmpl"), created=p.now(), model=alias, choices=choices,
                            usage=_usage(plan.prompt_tokens, completion_tokens))


async def chat_chunks(served: ServedModel, alias: str, req: p.ChatCompletionRequest,
                      plan: Plan) -> AsyncIterator[p.ChatCompletionChunk]:
    cid, created = p.new_id("chatcmpl"), p.now()

    def chunk(index: int, delta: p.ChoiceDelta, logprobs: p.ChoiceLogprobs | None = None,
              finish: str | None = None) -> p.ChatCompletionChunk:
        choice = p.ChunkChoice(index=index, delta=delta, logprobs=logprobs,
                               finish_reason=finish)  # type: ignore[arg-type]
        return p.ChatCompletionChunk(id=cid, created=created, model=alias, choices=[choice])

    completion_tokens = 0
    for index, request in enumerate(plan.requests):
        yield chunk(index, p.ChoiceDelta(role="assistant", content=""))
        async with served.scheduler.submit(request) as generation:
            async for event in generation:
                if isinstance(event, TextDelta):
                    logprobs = _chat_logprobs(event.tokens) if req.logprobs else None
                    yield chunk(index, p.ChoiceDelta(content=event.text), logprobs)
                elif isinstance(event, Finished):
                    completion_tokens += event.completion_tokens
                    yield chunk(index, p.ChoiceDelta(), finish=event.finish_reason)
    if req.include_usage_in_stream():
        yield p.ChatCompletionChunk(id=cid, created=created, model=alias, choices=[],
                                    usage=_usage(plan.prompt_tokens, completion_tokens))


# --------------------------------------------------------------------------------- completions

async def completion(served: ServedModel, alias: str, req: p.CompletionRequest,
                     plan: Plan) -> p.Completion:
    choices = []
    completion_tokens = 0
    for index, (request, echo) in enumerate(zip(plan.requests, plan.echo)):
        r = await _collect(served, request)
        completion_tokens += r.completion_tokens
        choices.append(p.CompletionChoice(
            index=index, text=echo + r.text,
            logprobs=_completion_logprobs(r.tokens, 0) if req.wants_logprobs() else None,
            finish_reason=r.finish_reason,  # type: ignore[arg-type]
        ))
    return p.Completion(id=p.new_id("cmpl"), created=p.now(), model=alias, choices=choices,
                        usage=_usage(plan.prompt_tokens, completion_tokens))


async def completion_chunks(served: ServedModel, alias: str, req: p.CompletionRequest,
                            plan: Plan) -> AsyncIterator[p.Completion]:
    cid, created = p.new_id("cmpl"), p.now()

    def chunk(index: int, text: str, logprobs: p.CompletionLogprobs | None = None,
              finish: str | None = None) -> p.Completion:
        choice = p.CompletionChoice(index=index, text=text, logprobs=logprobs,
                                    finish_reason=finish)  # type: ignore[arg-type]
        return p.Completion(id=cid, created=created, model=alias, choices=[choice])

    completion_tokens = 0
    for index, (request, echo) in enumerate(zip(plan.requests, plan.echo)):
        if echo:
            yield chunk(index, echo)
        offset = 0
        async with served.scheduler.submit(request) as generation:
            async for event in generation:
                if isinstance(event, TextDelta):
                    logprobs = None
                    if req.wants_logprobs():
                        logprobs = _completion_logprobs(event.tokens, offset)
                        offset += sum(len(t.text) for t in event.tokens)
                    yield chunk(index, event.text, logprobs)
                elif isinstance(event, Finished):
                    completion_tokens += event.completion_tokens
                    yield chunk(index, "", finish=event.finish_reason)
    if req.include_usage_in_stream():
        yield p.Completion(id=cid, created=created, model=alias, choices=[],
                           usage=_usage(plan.prompt_tokens, completion_tokens))


# --------------------------------------------------------------------------------- embeddings

async def embeddings(served: ServedModel, alias: str, req: p.EmbeddingRequest) -> p.EmbeddingList:
    n_embd, n_vocab = served.model.n_embd, served.model.n_vocab
    if req.dimensions is not None and req.dimensions != n_embd:
        raise invalid_request(f"this model's embeddings have {n_embd} dimensions", "dimensions")
    prompts: list[list[int]] = []
    for item in req.inputs():
        ids = served.text_prompt(item) if isinstance(item, str) else list(item)
        if not ids:
            raise invalid_request("input is empty after tokenizing", "input")
        if any(not 0 <= t < n_vocab for t in ids):
            raise invalid_request(f"input token ids must be in 0..{n_vocab - 1}", "input")
        if len(ids) > served.n_ctx:
            raise context_length_exceeded(len(ids), served.n_ctx, "input")
        prompts.append(ids)
    data = []
    for index, ids in enumerate(prompts):
        vector = await served.scheduler.embed(ids)  # float32 [n_embd]
        value: list[float] | str
        if req.encoding_format == "base64":
            value = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        else:
            value = [float(x) for x in vector]
        data.append(p.Embedding(index=index, embedding=value))
    total = sum(len(ids) for ids in prompts)
    return p.EmbeddingList(data=data, model=alias,
                           usage=p.EmbeddingUsage(prompt_tokens=total, total_tokens=total))
