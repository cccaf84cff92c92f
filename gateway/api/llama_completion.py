"""llama.cpp's POST /completion as a wire of the one pipeline (gateway/api/pipeline.py).

    plan     prompt (text, token ids, or a mix; several prompts -> several generations),
             n_predict (-1: the chat budget, gateway/generation/defaults.py; 0: evaluate only),
             sampling fields over the entry's and the GGUF's, logit_bias, ignore_eos
    whole    one object per prompt (an array for several): content, tokens, timings,
             completion_probabilities, generation_settings; cut to response_fields
    chunks   one prompt: a chunk per delta, then the final object; with return_progress,
             prompt_progress chunks first, with timings_per_token `timings` on every chunk
             (gateway/api/llama_telemetry.py)

Names and shapes are llama.cpp's (tools/server/README.md).
"""
from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import engine
from gateway.api import llama_protocol as lp
from gateway.api import llama_telemetry
from gateway.api.llama_probs import candidates_needed, post_sampling
from gateway.config import LimitSettings
from gateway.errors import APIError, context_length_exceeded, invalid_request
from gateway.fleet.registry import Lease
from gateway.generation import defaults, images, serving
from gateway.generation.choices import ChoiceResult
from gateway.generation.events import (
    Finished,
    GenerationRequest,
    PromptProgress,
    TextDelta,
    TokenInfo,
)
from gateway.generation.model import GenerativeModel
from gateway.generation.serving import Plan
from gateway.http.streaming import SSE, openai_error

BANNED = -1e9          # a logit bias that no sampler gets past (llama.cpp's `false`)
SEED_RANDOM = 4294967295  # how llama.cpp shows seed -1


# --------------------------------------------------------------------------------- planning

def _sampling(req: lp.CompletionRequest, lease: Lease, served: GenerativeModel) -> dict[str, Any]:
    """The request's sampling values, what it left out from the entry/GGUF/llama.cpp defaults."""
    base = defaults.effective(lease.entry, served.sampling_defaults).as_dict()
    sent = {k: getattr(req, k) for k in defaults.SAMPLING_FIELDS if getattr(req, k) is not None}
    return {**base, **sent}


def _logit_bias(req: lp.CompletionRequest, served: GenerativeModel) -> dict[int, float]:
    n_vocab = served.n_vocab
    pairs: list[tuple[Any, Any]] = []
    if isinstance(req.logit_bias, dict):
        pairs = [(int(k) if k.isdigit() else k, v) for k, v in req.logit_bias.items()]
    elif req.logit_bias is not None:
        for item in req.logit_bias:
            if len(item) != 2:
                raise invalid_request("logit_bias items must be [token, bias] pairs", "logit_bias")
            pairs.append((item[0], item[1]))
    out: dict[int, float] = {}
    for token, bias in pairs:
        if bias is False:
            value = BANNED
        elif isinstance(bias, int | float) and not isinstance(bias, bool):
            value = float(bias)
        else:
            raise invalid_request(f"logit_bias: the bias of {token!r} must be a number or false",
                                  "logit_bias")
        if isinstance(token, str):  # every token of the text, as llama.cpp does
            ids = served.tokenizer.encode(token, add_special=False, parse_special=False)
        elif isinstance(token, int) and not isinstance(token, bool) and 0 <= token < n_vocab:
            ids = [token]
        else:
            raise invalid_request(f"logit_bias token {token!r} is outside the vocabulary "
                                  f"(0..{n_vocab - 1})", "logit_bias")
        for t in ids:
            out[t] = value
    if req.ignore_eos:
        out.update(dict.fromkeys(served.tokenizer.eog_ids, BANNED))
    return out


def _prompt_ids(served: GenerativeModel, parts: list[int | str], limits: LimitSettings) -> list[int]:
    """A prompt of texts and ids as token ids; BOS (if the model wants it) before a leading text.
    Texts pass the same size checks as the OpenAI routes' prompts (serving.check_prompt_size)."""
    n_vocab = served.n_vocab
    ids: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            serving.check_prompt_size(served, part, limits, "prompt")
            ids += (served.text_prompt(part) if i == 0 else
                    served.tokenizer.encode(part, add_special=False, parse_special=True))
        elif 0 <= part < n_vocab:
            ids.append(part)
        else:
            raise invalid_request(f"prompt token ids must be in 0..{n_vocab - 1}", "prompt")
    return ids


def _seed(req: lp.CompletionRequest, lease: Lease) -> int | None:
    """The request's seed; -1 (random) takes the entry's seed when it has one."""
    return req.seed if req.seed >= 0 else lease.entry.seed


def _settings(values: dict[str, Any], req: lp.CompletionRequest, n_ctx: int, n_predict: int,
              alias: str, seed: int | None) -> dict[str, Any]:
    """llama.cpp's `generation_settings` (also /props' and /slots' `params`)."""
    return {"n_ctx": n_ctx, "model": alias, "n_predict": n_predict, "max_tokens": n_predict,
            "seed": SEED_RANDOM if seed is None else seed, **values, "stop": list(req.stop),
            "n_probs": req.n_probs, "post_sampling_probs": req.post_sampling_probs,
            "stream": req.stream, "ignore_eos": req.ignore_eos,
            "cache_prompt": req.cache_prompt}


@dataclass
class LlamaPlan(Plan):
    """A Plan with what llama.cpp's replies echo: each prompt's ids and text, the settings."""
    prompts: list[int] = field(default_factory=list)  # each prompt's positions (image rows too)
    texts: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # llama.cpp's generation_settings


def _plan(req: lp.CompletionRequest, lease: Lease, served: GenerativeModel, limits: LimitSettings
          ) -> LlamaPlan:
    """Runs in the model's prep threads (tokenizing is CPU work): the prompts' ids and texts,
    one generation per prompt (none for n_predict 0), and llama.cpp's generation_settings."""
    values = _sampling(req, lease, served)
    greedy = values["temperature"] <= 0 or values["top_p"] == 0
    budget = (defaults.chat_max_tokens(lease.entry, served.n_ctx) if req.n_predict < 0
              else req.n_predict)
    params = engine.SamplingParams(
        temperature=0.0 if greedy else values["temperature"], top_k=max(0, values["top_k"]),
        top_p=1.0 if greedy else values["top_p"], min_p=values["min_p"],
        repeat_penalty=values["repeat_penalty"], presence_penalty=values["presence_penalty"],
        frequency_penalty=values["frequency_penalty"], logit_bias=_logit_bias(req, served),
        seed=_seed(req, lease), top_logprobs=(
            candidates_needed(req.n_probs, values["top_k"]) if req.post_sampling_probs
            and req.n_probs else req.n_probs),
        logprobs=bool(req.n_probs))
    lora = served.lora.for_engine(None if req.lora is None else [(e.id, e.scale) for e in req.lora])
    prompts: list[engine.Prompt] = []
    texts: list[str] = []
    for number, one in enumerate(req.prompts()):
        if isinstance(one, lp.MultimodalPrompt):
            prompt = _multimodal_prompt(served, one, number, len(req.prompts()) > 1, limits)
            texts.append(one.prompt_string)
        else:
            ids = _prompt_ids(served, one, limits)
            if not ids:
                raise invalid_request("prompt is empty after tokenizing", "prompt")
            prompt = engine.Prompt.of_tokens(ids)
            texts.append(served.tokenizer.decode(ids))
        if len(prompt) >= served.n_ctx:
            raise context_length_exceeded(len(prompt), served.n_ctx, "prompt")
        prompts.append(prompt)
    requests = [GenerationRequest(prompt=prompt, params=params,
                                  max_tokens=min(budget, served.n_ctx - len(prompt)),
                                  stop=tuple(s for s in req.stop if s),
                                  logprobs=True,  # token ids come with logprobs
                                  speculative=req.speculative and req.speculative_n_max != 0,
                                  id_slot=req.id_slot, cache_prompt=req.cache_prompt,
                                  lora=lora, progress=req.stream and req.return_progress,
                                  timings=req.stream and req.timings_per_token)
                for prompt in prompts]
    if req.id_slot >= lease.entry.n_parallel:
        raise invalid_request(f"id_slot {req.id_slot} is not a slot of this model "
                              f"(0..{lease.entry.n_parallel - 1})", "id_slot")
    if req.stream and len(requests) > 1:
        raise invalid_request("stream takes one prompt; send several prompts without stream",
                              "prompt")
    settings = _settings(values, req, served.n_ctx, budget, lease.alias, _seed(req, lease))
    # llama.cpp's shape: [{bias, token}], a ban (-inf there) written as null
    settings["logit_bias"] = [{"bias": None if bias <= BANNED else bias, "token": token}
                              for token, bias in params.logit_bias.items()]
    return LlamaPlan(requests if req.n_predict != 0 else [],  # n_predict 0: only evaluated
                     sum(len(p) for p in prompts), prompt_of=list(range(len(prompts))),
                     prompts=[len(p) for p in prompts], texts=texts, settings=settings)


def _multimodal_prompt(served: GenerativeModel, one: lp.MultimodalPrompt, number: int,
                       several: bool, limits: LimitSettings) -> engine.Prompt:
    """A prompt object: its text with the images of multimodal_data at its media markers (on
    the prep thread: base64, decoding and the encoder are CPU work)."""
    where = f"prompt[{number}]" if several else "prompt"
    serving.check_prompt_size(served, one.prompt_string, limits, where)
    if not one.multimodal_data:
        ids = served.text_prompt(one.prompt_string)
        if not ids:
            raise invalid_request("prompt is empty after tokenizing", where)
        return engine.Prompt.of_tokens(ids)
    parts = [f"{where}.multimodal_data[{k}]" for k in range(len(one.multimodal_data))]
    loaded = [images.LoadedImage(param, images.decode_base64(data, param))
              for param, data in zip(parts, one.multimodal_data)]
    return images.image_prompt(served, one.prompt_string, loaded, images.MEDIA_MARKER, where)

# --------------------------------------------------------------------------------- responses

def _probs(tokens: list[TokenInfo], req: lp.CompletionRequest,
           settings: dict[str, Any]) -> list[dict[str, Any]]:
    """completion_probabilities: the n_probs best log-probabilities, or with
    post_sampling_probs the probabilities left after the sampler's filters (llama_probs.py)."""
    if not req.post_sampling_probs:
        return [{"id": t.token, "token": t.text, "bytes": list(t.bytes), "logprob": t.logprob,
                 "top_logprobs": [{"id": i, "token": text, "bytes": list(raw), "logprob": lp}
                                  for i, (text, raw, lp) in
                                  list(zip(t.top_ids, t.top))[:req.n_probs]]}
                for t in tokens]
    out = []
    for t in tokens:
        pieces = {i: (text, raw) for i, (text, raw, _) in zip(t.top_ids, t.top)}
        kept = post_sampling([(i, lp) for i, (_, _, lp) in zip(t.top_ids, t.top)],
                             top_k=settings["top_k"], top_p=settings["top_p"],
                             min_p=settings["min_p"], temperature=settings["temperature"])
        chosen = dict(kept).get(t.token, math.exp(t.logprob))
        out.append({"id": t.token, "token": t.text, "bytes": list(t.bytes), "prob": chosen,
                    "top_probs": [{"id": i, "token": pieces[i][0], "bytes": list(pieces[i][1]),
                                   "prob": prob} for i, prob in kept[:req.n_probs]]})
    return out


def _final(index: int, text: str, ids: list[int], tokens: list[TokenInfo], done: Finished,
           req: lp.CompletionRequest, settings: dict[str, Any], prompt: str, n_ctx: int,
           streamed: bool) -> dict[str, Any]:
    stop_type = "word" if done.stop_word else "limit" if done.finish_reason == "length" else "eos"
    out: dict[str, Any] = {
        "index": index, "content": "" if streamed else text,
        "tokens": ids if req.return_tokens and not streamed else [], "id_slot": -1, "stop": True,
        "model": settings["model"], "tokens_predicted": done.completion_tokens,
        "tokens_evaluated": done.prompt_tokens, "generation_settings": settings,
        "prompt": prompt, "has_new_line": "\n" in text,
        "truncated": done.prompt_tokens + done.completion_tokens >= n_ctx,
        "stop_type": stop_type, "stopping_word": done.stop_word,
        "tokens_cached": done.cached_tokens, "timings": llama_telemetry.timings(done.timings),
    }
    if req.n_probs and not streamed:
        out["completion_probabilities"] = _probs(tokens, req, settings)
    return out


def _only_fields(body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama.cpp's `response_fields`: keep these; "a/b" moves a["b"] to the top as "a/b"."""
    if not fields:
        return body
    out: dict[str, Any] = {}
    for name in fields:
        value: Any = body
        for part in name.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[name] = value
    return out


def _evaluated_only(index: int, n_prompt: int, req: lp.CompletionRequest,
                    settings: dict[str, Any], prompt: str, n_ctx: int) -> dict[str, Any]:
    """n_predict 0: nothing generated (llama.cpp then only fills the cache)."""
    return _final(index, "", [], [], Finished("length", n_prompt, 0), req, settings, prompt,
                  n_ctx, streamed=False)



def whole(served: GenerativeModel, alias: str, req: lp.CompletionRequest, plan: LlamaPlan,
          results: list[ChoiceResult]) -> Any:
    """One object per prompt (an array for several), cut to `response_fields`."""
    n_ctx = served.n_ctx
    if not plan.requests:  # n_predict 0
        bodies = [_evaluated_only(i, n, req, plan.settings, plan.texts[i], n_ctx)
                  for i, n in enumerate(plan.prompts)]
    else:
        bodies = [_final(i, r.text, [t.token for t in r.tokens], r.tokens, _finished(r), req,
                         plan.settings, plan.texts[i], n_ctx, streamed=False)
                  for i, r in enumerate(results)]
    out = [_only_fields(body, req.response_fields) for body in bodies]
    return out[0] if len(out) == 1 else out


def _finished(result: ChoiceResult) -> Finished:
    if result.finished is None:  # the scheduler always finishes what it runs
        raise RuntimeError("a generation ended without finishing")
    return result.finished


async def chunks(served: GenerativeModel, alias: str, req: lp.CompletionRequest,
                 plan: LlamaPlan) -> AsyncIterator[dict[str, Any]]:
    """The stream of its one prompt: a chunk per delta, then the final object."""
    generation = plan.submitted[0]
    settings, prompt, n_ctx = plan.settings, plan.texts[0], served.n_ctx
    count = 0
    tokens: list[TokenInfo] = []
    text: list[str] = []
    n_prompt = len(plan.requests[0].prompt)

    def partial(content: str, ids: list[int]) -> dict[str, Any]:
        return {"index": 0, "content": content, "tokens": ids, "stop": False, "id_slot": -1,
                "model": settings["model"], "tokens_predicted": count,
                "tokens_evaluated": n_prompt}

    try:
        async for event in generation:
            if isinstance(event, TextDelta):
                count += len(event.tokens)
                tokens += event.tokens
                text.append(event.text)
                chunk = partial(event.text, [t.token for t in event.tokens])
                if event.timings is not None:
                    chunk["timings"] = llama_telemetry.timings(event.timings)
                if req.n_probs:
                    chunk["completion_probabilities"] = _probs(event.tokens, req, settings)
                yield chunk
            elif isinstance(event, PromptProgress):
                if req.return_progress:  # unasked, a long prompt's progress is not shown here
                    yield {**partial("", []),
                           "prompt_progress": llama_telemetry.prompt_progress(event)}
            elif isinstance(event, Finished):
                yield _final(0, "".join(text), [], tokens, event, req, settings, prompt, n_ctx,
                             streamed=True)
    finally:
        plan.cancel()  # the client left early: the slot is freed at the next step


class CompletionWire:
    """POST /completion as a wire of the one pipeline."""

    async def plan(self, model: GenerativeModel, lease: Lease, req: lp.CompletionRequest,
                   limits: LimitSettings) -> LlamaPlan:
        images.check_takes_images(model, lease.alias, [
            images.ImagePart("prompt.multimodal_data") for one in req.prompts()
            if isinstance(one, lp.MultimodalPrompt) and one.multimodal_data])
        return await model.prepare(_plan, req, lease, model, limits)

    framing = SSE
    whole = staticmethod(whole)
    chunks = staticmethod(chunks)


    def error(self, error: APIError) -> dict[str, Any]:
        return openai_error(error)  # llama.cpp's server sends OpenAI's shape too


COMPLETION = CompletionWire()
