"""One validated request -> a Plan: its generation requests, submitted together; and embeddings.

Planning (template, tokenizing, context check) happens before anything is sent, so its errors are
proper 400s. It is CPU work, so it runs in the model's `prep` threads, never on the event loop,
within `limits`: the template has a time budget and an output cap, and a prompt too long to
fit the context is refused before it is tokenized. Choices (`n`, several prompts) are submitted
together and run side by side in the model's batch; the n choices of a prompt share its token
list, so the scheduler reads the prompt once. Running them is gateway/generation/choices.py's,
rendering them the wire's (gateway/api/openai_wire.py, llama_completion.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import engine
from engine.thinking_budget import ThinkingBudget
from engine.tool_formats import THINK_CLOSE, ThinkingFormat
from gateway import protocol as p
from gateway.config import LimitSettings
from gateway.errors import APIError, context_length_exceeded, invalid_request
from gateway.generation import images, reasoning
from gateway.generation.events import (
    GenerationObserver,
    GenerationRequest,
)
from gateway.generation.model import Generation, GenerativeModel
from gateway.generation.structured import Output, chat_output, completion_output
from gateway.generation.tool_stream import ReplyReader
from gateway.protocol.chat import IMAGE_MARKER

T = TypeVar("T")
DEFAULT_LIMITS = LimitSettings()


@dataclass
class Plan:
    """Generation requests in choice order and the prompt tokens they bill once."""
    requests: list[GenerationRequest]
    prompt_tokens: int
    echo: list[str] = field(default_factory=list)  # completions with echo: text before each choice
    prompt_of: list[int] = field(default_factory=list)  # per choice: which prompt it continues
    submitted: list[Generation] = field(default_factory=list)  # the generations, once submitted
    output: Output = field(default_factory=Output)       # the grammar, the tool-call format
    reasoning: reasoning.Settings = field(default_factory=reasoning.Settings)
    inside: bool = False                 # the prompt opened the thinking block
    also_reasoning: bool = False         # repeat reasoning_content as `reasoning` (entry key)

    async def prepare(self, served: GenerativeModel) -> None:
        """Compile the grammar (on a worker thread; a 400 if it does not compile) and give each
        choice its own copy. Call before submit()."""
        constraint = await self.output.compile(served.tokenizer)
        # markers that are control tokens must reach the reader (Harmony's, even without tools)
        keep = self.output.tool_format is not None and self.output.tool_format.keeps_markers
        if constraint is None and not keep:
            return
        self.requests = [dataclasses.replace(
            r, constraint=constraint.copy() if constraint is not None else None, keep_special=keep)
            for r in self.requests]

    def observe(self, observer: GenerationObserver) -> None:
        """Have `observer` told every event of every choice (the request's metrics)."""
        self.requests = [dataclasses.replace(r, observer=observer) for r in self.requests]

    def reader(self) -> ReplyReader | None:
        """A fresh reader for one choice's reply when it may hold tool calls."""
        fmt = self.output.tool_format
        if fmt is None:
            return None
        return ReplyReader(fmt, self.inside, self.reasoning.format, self.also_reasoning)

    def submit(self, served: GenerativeModel) -> None:
        """Queue every choice at once (they share the batch); all or none. Streams call it before
        the headers go out, so a full queue is a 503; cancel() undoes it if the stream never runs."""
        generations: list[Generation] = []
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



def _check_logit_bias(served: GenerativeModel, bias: dict[str, float] | None) -> None:
    n_vocab = served.n_vocab
    for key in bias or {}:
        if int(key) >= n_vocab:
            raise invalid_request(f"logit_bias token {key} is outside the vocabulary (0..{n_vocab - 1})",
                                  "logit_bias")


def _generation(served: GenerativeModel, req: p.GenerationRequestBody, prompt: engine.Prompt,
                choice: int, param: str, thinking: ThinkingBudget | None = None) -> GenerationRequest:
    """One choice's request; the n choices of a prompt share its Prompt (usage bills it once)."""
    if len(prompt) >= served.n_ctx:
        raise context_length_exceeded(len(prompt), served.n_ctx, param)
    room = served.n_ctx - len(prompt)
    budget = req.token_budget()
    return GenerationRequest(
        prompt=prompt,
        params=p.sampling_params(req, choice),
        max_tokens=room if budget is None else min(budget, room),
        stop=tuple(req.stop_list()),
        logprobs=req.wants_logprobs(),
        budget=thinking.copy() if thinking is not None else None,
        speculative=req.speculative,
        lora=served.lora.for_engine(req.lora_pairs()),
        progress=req.stream and req.return_progress,
        timings=req.stream and req.timings_per_token,
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


def _chat_ids(served: GenerativeModel, output: Output, limits: LimitSettings
              ) -> tuple[list[int], bool]:
    """The prompt's tokens, and whether it opened the thinking block."""
    text = served.chat_template.render(output.messages, add_generation_prompt=True,
                                       tools=output.template_tools,
                                       time_budget=limits.template_timeout,
                                       max_chars=limits.max_prompt,
                                       variables=output.template_vars)
    return tokenize_prompt(served, text, limits, "messages"), reasoning.opens_block(text)


def _chat_text(served: GenerativeModel, output: Output, limits: LimitSettings) -> str:
    text = served.chat_template.render(output.messages, add_generation_prompt=True,
                                       tools=output.template_tools,
                                       time_budget=limits.template_timeout,
                                       max_chars=limits.max_prompt,
                                       variables=output.template_vars)
    check_prompt_size(served, text, limits, "messages")
    return text


def chat_image_parts(req: p.ChatCompletionRequest,
                     image_params: Sequence[str] = ()) -> list[images.ImagePart]:
    """The image parts of `req`, in order. `image_params`: where each was in the request the
    client sent, when a wire translated it (an Anthropic block, a Responses part, an Ollama
    image): errors then name the client's field, not the chat request's."""
    parts = [images.ImagePart(f"messages[{i}].content[{j}]", url=url)
             for i, m in enumerate(req.messages) for j, url in m.image_urls()]
    if not image_params:
        return parts
    return [dataclasses.replace(part, param=param)
            for part, param in zip(parts, image_params, strict=True)]


async def plan_chat(served: GenerativeModel, req: p.ChatCompletionRequest,
                    limits: LimitSettings = DEFAULT_LIMITS, also_reasoning: bool = False,
                    image_params: Sequence[str] = (),
                    input_grammars: Mapping[str, tuple[str, str]] | None = None) -> Plan:
    """`req`'s reasoning fields (gateway/generation/reasoning.py) reach the template, the
    reply's reader and, as a budget, each choice; `image_params`: see chat_image_parts;
    `input_grammars`: freeform tools' (see structured.chat_output)."""
    _check_logit_bias(served, req.logit_bias)
    parts = chat_image_parts(req, image_params)
    images.check_takes_images(served, str(req.model), parts)  # before the template's work
    output = chat_output(req, served.tool_format, input_grammars)
    settings = reasoning.settings(req)
    output.template_vars = served.tool_format.template_vars(dict(settings.template_vars))
    if parts:
        rendered: list[str] = []  # the templated text, to see whether it opened the block

        def render() -> str:
            rendered.append(_chat_text(served, output, limits))
            return rendered[-1]

        prompt = await images.prompt_with_images(served, str(req.model), parts, render, limits,
                                                 IMAGE_MARKER)
        inside = bool(rendered) and reasoning.opens_block(rendered[-1])
    else:
        ids, inside = await off_loop(served, _chat_ids, served, output, limits)
        prompt = engine.Prompt.of_tokens(ids)
    if inside and output.tool_format is None:  # the reply starts in the block the prompt opened
        output.tool_format = ThinkingFormat(served.tool_format.special)
    if inside:  # and a schema or tool grammar waits for its end
        close = served.tool_format.special(THINK_CLOSE)
        output.after_opened_block(f"<[{close}]>" if close is not None else THINK_CLOSE)
    budget = reasoning.budget(served, settings.budget, inside)
    return Plan([_generation(served, req, prompt, i, "messages", budget) for i in range(req.n)],
                len(prompt), prompt_of=[0] * req.n, output=output, reasoning=settings,
                inside=inside, also_reasoning=also_reasoning)


async def count_chat_tokens(served: GenerativeModel, req: p.ChatCompletionRequest,
                            limits: LimitSettings = DEFAULT_LIMITS,
                            image_params: Sequence[str] = ()) -> int:
    """The prompt positions `req` would be planned with (its messages, tools and reasoning
    fields, templated; an image's rows counted as the image path lays them out)."""
    output = chat_output(req, served.tool_format)
    output.template_vars = served.tool_format.template_vars(
        dict(reasoning.settings(req).template_vars))
    parts = chat_image_parts(req, image_params)
    if parts:
        return len(await images.prompt_with_images(
            served, str(req.model), parts, lambda: _chat_text(served, output, limits), limits,
            IMAGE_MARKER))
    return len((await off_loop(served, _chat_ids, served, output, limits))[0])


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
        tokens = engine.Prompt.of_tokens(ids)
        for i in range(req.n):
            requests.append(_generation(served, req, tokens, i, "prompt"))
            echo.append(text if req.echo else "")
            prompt_of.append(number)
    return Plan(requests, total, echo, prompt_of, output=completion_output(req))
