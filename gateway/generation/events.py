"""What a generation is asked (GenerationRequest), what it answers (events, in order), and the
errors a model's scheduler raises to the routes (gateway/errors.py turns them into HTTP).

    PromptProgress* (long prompts) -> TextDelta* -> Finished        or an exception instead

A request with `progress` (llama.cpp's `return_progress`) gets a PromptProgress when its slot
starts (processed == cached) and after every chunk of its prompt read, short prompts too; one
with `timings` (llama.cpp's `timings_per_token`) gets a Timings snapshot on every TextDelta.
"""
from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Protocol

import engine
from engine.thinking_budget import ThinkingBudget


class GenerationObserver(Protocol):
    """Told each event of a generation as its consumer receives it (gateway/metrics.py's
    RequestMetrics: time to first token, tokens as usage bills them)."""

    def event(self, request: GenerationRequest, event: Event) -> None: ...


@dataclass(frozen=True)
class GenerationRequest:
    prompt: engine.Prompt                # token and embedding spans (engine/prompt.py)
    params: engine.SamplingParams
    max_tokens: int                      # already capped to what the context leaves
    stop: tuple[str, ...] = ()
    logprobs: bool = False               # attach TokenInfo to deltas
    constraint: engine.Constraint | None = None  # a grammar this choice alone follows
    keep_special: bool = False           # decode control tokens too (tool-call markers)
    budget: ThinkingBudget | None = None  # closes the thinking block after N tokens (this choice's)
    speculative: bool = True             # draft when the model is configured to (False: opt out)
    id_slot: int = -1                    # the slot to run in (llama.cpp's id_slot); -1: any
    cache_prompt: bool = True            # False: reuse no cached prefix (llama.cpp's cache_prompt)
    lora: tuple[float, ...] | None = None  # its adapters' scales, None: the merged ones (lora_scales.py)
    progress: bool = False               # report the start and every prompt chunk (return_progress)
    timings: bool = False                # a Timings on every TextDelta (timings_per_token)
    observer: GenerationObserver | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TokenInfo:
    """One generated token for logprobs: its text, raw bytes, log-probability, alternatives."""
    token: int
    text: str
    bytes: bytes
    logprob: float
    top: list[tuple[str, builtins.bytes, float]] = field(default_factory=list)  # `bytes` is a field
    top_ids: list[int] = field(default_factory=list)  # the alternatives' token ids, as `top`


@dataclass(frozen=True)
class PromptProgress:
    """A prompt is being read: `processed` of `total` tokens (`cached` came for free), `seconds`
    after its slot took it (llama.cpp's prompt_progress.time_ms)."""
    processed: int
    total: int
    cached: int
    seconds: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class Timings:
    """Where a generation stands (llama.cpp's `timings`): its prompt, the tokens generated so
    far, the seconds from submit to the first token and from the first token to now."""
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prompt_seconds: float
    predicted_seconds: float
    draft_n: int = 0
    draft_accepted: int = 0


@dataclass(frozen=True)
class TextDelta:
    text: str
    tokens: list[TokenInfo]              # empty unless logprobs were requested
    timings: Timings | None = field(default=None, compare=False)  # with GenerationRequest.timings


@dataclass(frozen=True)
class Finished:
    finish_reason: str                   # "stop" (eog or stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0               # prompt tokens reused from a slot, not evaluated
    # timings (llama.cpp's `timings`), left out of equality: they differ from run to run
    prompt_seconds: float = field(default=0.0, compare=False)     # submit -> first token
    predicted_seconds: float = field(default=0.0, compare=False)  # first token -> end
    stop_word: str = ""                  # the stop string that ended it, if one did
    # speculative decoding (llama.cpp's timings.draft_n / draft_n_accepted): drafted tokens
    # the model checked, and of them those it kept
    draft_n: int = field(default=0, compare=False)
    draft_accepted: int = field(default=0, compare=False)

    @property
    def timings(self) -> Timings:
        return Timings(self.prompt_tokens, self.cached_tokens, self.completion_tokens,
                       self.prompt_seconds, self.predicted_seconds, self.draft_n,
                       self.draft_accepted)


Event = PromptProgress | TextDelta | Finished


class QueueFullError(Exception):
    """A model's queue holds `max_queue` requests already; the client should retry later."""

    def __init__(self, name: str, max_queue: int, retry_after: float = 1.0) -> None:
        super().__init__(f"model '{name}' has {max_queue} requests waiting; retry later")
        self.retry_after = retry_after


class ModelBrokenError(Exception):
    """The model cannot serve any more: its file changed under the mapping, or it produced
    non-finite logits. The registry unloads it (gateway/fleet/registry/); a later request loads
    the file afresh."""

    def __init__(self, name: str, reason: str, retry_after: float = 1.0,
                 retryable: bool = True) -> None:
        super().__init__(f"model '{name}' stopped serving: {reason}")
        self.reason = reason
        self.retry_after = retry_after
        self.retryable = retryable  # a changed file loads afresh; corrupt weights stay corrupt


class ServerStoppingError(Exception):
    """The server's shutdown deadline ended this request (streams still get [DONE] after it)."""

    def __init__(self, seconds: float, retry_after: float = 5.0) -> None:
        super().__init__(f"the server is shutting down: running requests were given "
                         f"{seconds:g} s to finish; retry elsewhere or later")
        self.retry_after = retry_after


class GenerationCancelled(Exception):
    """Told to whoever still iterates a generation that was cancelled."""


class SchedulerClosedError(Exception):
    """The model was unloaded (or the server is stopping) before this request ran."""

    def __init__(self, name: str, retry_after: float = 1.0) -> None:
        super().__init__(f"model '{name}' was unloaded before the request ran; retry")
        self.retry_after = retry_after
