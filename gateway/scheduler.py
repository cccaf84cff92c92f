"""Per-model request scheduling: a worker thread runs generations; events flow back to asyncio.

For now each model runs one request at a time, first come first served; `max_queue` more may
wait behind it (beyond that: QueueFullError, a 503). A job's life:

    queued --worker takes it--> running --model.stream ends--> finished (Finished event)
      |                            |----raises-----------> failed (the exception is the event)
      +--cancel()/close()--+       +----cancel()/close()--> cancelled (checked before each token)
                           v
                 skipped (close(): SchedulerClosedError)

    asyncio side                        worker thread (one per loaded model)
    ------------                        ------------------------------------
    submit(req) --job--> queue.Queue --> take job -> skip if cancelled
    async for ev in generation  <------  model.stream(): per token -> decode -> StopScanner
          ^   (loop.call_soon_threadsafe)        -> TextDelta ... Finished (or the exception)
    cancel() sets a flag the worker checks before every token, then it moves to the next job.

The interface is request-level (`submit` -> async iterator of events, `cancel`), so continuous
batching can replace the inside without touching the routes.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

import engine
from engine.chat import ChatTemplate, ChatTemplateError

if TYPE_CHECKING:
    from .config import ModelEntry

log = logging.getLogger("modelyard.scheduler")


# --------------------------------------------------------------------------------- requests, events

@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    params: engine.SamplingParams
    max_tokens: int                      # already capped to what the context leaves
    stop: tuple[str, ...] = ()
    logprobs: bool = False               # attach TokenInfo to deltas


@dataclass(frozen=True)
class TokenInfo:
    """One generated token for logprobs: its text, raw bytes, log-probability, alternatives."""
    token: int
    text: str
    bytes: bytes
    logprob: float
    top: list[tuple[str, bytes, float]] = field(default_factory=list)


@dataclass(frozen=True)
class TextDelta:
    text: str
    tokens: list[TokenInfo]              # empty unless logprobs were requested


@dataclass(frozen=True)
class Finished:
    finish_reason: str                   # "stop" (eog or stop string) or "length"
    prompt_tokens: int
    completion_tokens: int


Event = TextDelta | Finished


class QueueFullError(Exception):
    """A model's queue holds `max_queue` requests already; the client should retry later."""

    def __init__(self, name: str, max_queue: int, retry_after: float = 1.0) -> None:
        super().__init__(f"model '{name}' has {max_queue} requests waiting; retry later")
        self.retry_after = retry_after


class GenerationCancelled(Exception):
    """Told to whoever still iterates a generation that was cancelled."""


class SchedulerClosedError(Exception):
    """The model was unloaded (or the server is stopping) before this request ran."""

    def __init__(self, name: str, retry_after: float = 1.0) -> None:
        super().__init__(f"model '{name}' was unloaded before the request ran; retry")
        self.retry_after = retry_after


# --------------------------------------------------------------------------------- stop strings

T = TypeVar("T")


class StopScanner(Generic[T]):
    """Releases generated text in order, never any part of a stop string.

    Text that could still turn into a stop string (a suffix that is a prefix of one) is held
    back; a match cuts the text where it starts and ends the generation. Each piece of text
    travels with an item (its token's logprobs), released whole with the piece it came with.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.stopped = False
        self._held: list[tuple[str, T]] = []

    def push(self, piece: str, item: T) -> tuple[str, list[T]]:
        """Add one token's text; returns the text and items now safe to release."""
        if self.stopped:
            return "", []
        self._held.append((piece, item))
        if not self.stops:
            return self.flush()
        text = "".join(p for p, _ in self._held)
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            return self._release(min(hits), cut=True)
        return self._release(len(text) - self._partial_suffix(text), cut=False)

    def flush(self) -> tuple[str, list[T]]:
        """Release everything held (the generation ended for another reason)."""
        text = "".join(p for p, _ in self._held)
        items = [it for _, it in self._held]
        self._held = []
        return text, items

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _release(self, limit: int, cut: bool) -> tuple[str, list[T]]:
        out: list[str] = []
        items: list[T] = []
        start = 0
        while self._held:
            piece, item = self._held[0]
            end = start + len(piece)
            if end <= limit:
                out.append(piece)
                items.append(item)
            elif cut and start < limit:  # the token in which the stop string begins
                out.append(piece[:limit - start])
                items.append(item)
            else:
                break
            self._held.pop(0)
            start = end
        if cut:
            self._held = []
        return "".join(out), items


# --------------------------------------------------------------------------------- jobs

class _Job:
    """A unit of work for the worker thread, reporting back into one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.cancelled = threading.Event()
        self.cancel_reason: BaseException | None = None  # told to a consumer still listening

    def post(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run fn(*args) on the event loop; False when the loop is gone (shutdown)."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:
            self.cancelled.set()
            return False

    def run(self, model: Any) -> None:
        raise NotImplementedError

    def fail(self, exc: BaseException) -> None:
        raise NotImplementedError


class _GenerationJob(_Job):
    def __init__(self, loop: asyncio.AbstractEventLoop, request: GenerationRequest) -> None:
        super().__init__(loop)
        self.request = request
        self.events: asyncio.Queue[Event | BaseException] = asyncio.Queue()

    def emit(self, event: Event | BaseException) -> None:
        self.post(self.events.put_nowait, event)

    def fail(self, exc: BaseException) -> None:
        self.emit(exc)

    def run(self, model: Any) -> None:
        req = self.request
        tok = model.tokenizer
        decoder = tok.incremental_decoder(skip_special=True)
        scanner: StopScanner[TokenInfo | None] = StopScanner(req.stop)
        n_generated = 0
        finish = "length"
        with contextlib.closing(model.stream(req.prompt_ids, req.params, req.max_tokens)) as stream:
            for sampled in stream:
                if self.cancelled.is_set():
                    self.emit(self.cancel_reason or GenerationCancelled())
                    return
                n_generated += 1
                info = _token_info(tok, sampled) if req.logprobs else None
                self._send(*scanner.push(decoder.push(sampled.token), info))
                if scanner.stopped:
                    finish = "stop"
                    break
            else:
                ended_early = n_generated < req.max_tokens
                context_full = len(req.prompt_ids) + n_generated >= model.n_ctx
                finish = "stop" if ended_early and not context_full else "length"
                self._send(*scanner.push(decoder.flush(), None))
                if scanner.stopped:
                    finish = "stop"
                self._send(*scanner.flush())
        self.emit(Finished(finish, len(req.prompt_ids), n_generated))

    def _send(self, text: str, items: list[TokenInfo | None]) -> None:
        tokens = [t for t in items if t is not None]
        if text or tokens:
            self.emit(TextDelta(text, tokens))


class _EmbeddingJob(_Job):
    def __init__(self, loop: asyncio.AbstractEventLoop, ids: list[int]) -> None:
        super().__init__(loop)
        self.ids = ids
        self.future: asyncio.Future[np.ndarray] = loop.create_future()

    def _settle(self, value: Any, error: bool) -> None:
        if not self.future.done():
            (self.future.set_exception if error else self.future.set_result)(value)

    def run(self, model: Any) -> None:
        self.post(self._settle, model.embed(self.ids), False)

    def fail(self, exc: BaseException) -> None:
        self.post(self._settle, exc, True)


def _token_text(tok: Any, token: int) -> tuple[str, bytes]:
    raw = tok.token_bytes(token)
    return raw.decode("utf-8", errors="backslashreplace"), raw


def _token_info(tok: Any, sampled: engine.Sampled) -> TokenInfo:
    text, raw = _token_text(tok, sampled.token)
    top = [(*_token_text(tok, t), lp) for t, lp in sampled.top_logprobs]
    return TokenInfo(sampled.token, text, raw, sampled.logprob, top)


# --------------------------------------------------------------------------------- async side

class Generation:
    """The asyncio handle of one submitted generation: iterate its events, or cancel it.

    Use as `async with scheduler.submit(req) as gen: async for event in gen: ...`; leaving the
    block early (client gone, error) cancels the generation so the worker moves on.
    """

    def __init__(self, job: _GenerationJob) -> None:
        self._job = job
        self._done = False

    def cancel(self) -> None:
        self._job.cancelled.set()

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        event = await self._job.events.get()
        if isinstance(event, BaseException):
            self._done = True
            raise event
        if isinstance(event, Finished):
            self._done = True
        return event

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._done:
            self.cancel()


class Scheduler:
    """One worker thread per model; jobs run FIFO, one at a time."""

    def __init__(self, model: Any, *, name: str = "model", max_queue: int = 64) -> None:
        self.model = model
        self.name = name
        self.max_queue = max_queue
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()   # guards _closed and _waiting against close()
        self._closed = False
        self._waiting: set[_Job] = set()
        self._running: _Job | None = None
        self._thread = threading.Thread(target=self._work, name=f"modelyard-{name}", daemon=True)
        self._thread.start()

    def submit(self, request: GenerationRequest) -> Generation:
        job = _GenerationJob(asyncio.get_running_loop(), request)
        self._enqueue(job)
        return Generation(job)

    async def embed(self, ids: list[int]) -> np.ndarray:
        """float32 [n_embd] for one input, computed on the worker thread."""
        job = _EmbeddingJob(asyncio.get_running_loop(), ids)
        self._enqueue(job)
        try:
            return await job.future
        finally:
            job.cancelled.set()

    @property
    def queued(self) -> int:
        """Requests waiting for the worker (cancelled ones no longer count)."""
        with self._lock:
            return sum(not j.cancelled.is_set() for j in self._waiting)

    def _enqueue(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise SchedulerClosedError(self.name)
            waiting = sum(not j.cancelled.is_set() for j in self._waiting)
            busy = waiting + (self._running is not None)
            if busy >= 1 + self.max_queue:  # one runs, max_queue wait behind it
                raise QueueFullError(self.name, self.max_queue)
            self._waiting.add(job)
            self._jobs.put(job)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting.discard(job)
                if job.cancelled.is_set():
                    continue
                self._running = job
            try:
                job.run(self.model)
            except BaseException as exc:  # report to the request, keep serving others
                log.exception("generation failed on %s", self.name)
                job.fail(exc)
            finally:
                with self._lock:
                    self._running = None

    def close(self) -> None:
        """Fail queued requests, cancel the running one, and wait for the worker to stop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting, self._waiting = self._waiting, set()
            running = self._running
        for job in waiting:
            job.cancelled.set()
            job.fail(SchedulerClosedError(self.name))
        if running is not None:
            running.cancel_reason = SchedulerClosedError(self.name)
            running.cancelled.set()
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()


# --------------------------------------------------------------------------------- served model

class ServedModel:
    """What the registry holds for a loaded model: engine model + scheduler + chat template."""

    def __init__(self, model: Any, template: ChatTemplate, *, name: str, max_queue: int) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.n_ctx: int = model.n_ctx
        self.chat_template = template
        self.scheduler = Scheduler(model, name=name, max_queue=max_queue)

    @property
    def memory_bytes(self) -> int:
        return int(self.model.memory_bytes)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """Render the chat template and tokenize it, special tokens parsed as such."""
        text = self.chat_template.render(messages, add_generation_prompt=True)
        return self.text_prompt(text)

    def text_prompt(self, text: str) -> list[int]:
        """Tokenize a prompt; BOS is added when the model wants it and the text lacks it."""
        tok = self.tokenizer
        bos = self.chat_template.bos_token
        add_bos = bool(tok.add_bos) and not (bos and text.startswith(bos))
        return list(tok.encode(text, add_special=add_bos, parse_special=True))

    def close(self) -> None:
        self.scheduler.close()
        self.model.close()


def _template_for(model: Any, override: str | None) -> ChatTemplate:
    tok = model.tokenizer
    tokens = model.metadata.get("tokenizer.ggml.tokens") or []
    if override is not None:  # config.py has validated that it compiles
        return ChatTemplate.for_model(override, tokens, tok.bos_id, tok.eos_id)
    try:
        return ChatTemplate.for_model(model.chat_template, tokens, tok.bos_id, tok.eos_id)
    except ChatTemplateError as exc:
        log.warning("%s: %s; using ChatML instead", model.path, exc)
        return ChatTemplate.for_model(None, tokens, tok.bos_id, tok.eos_id)


def load_served_model(entry: ModelEntry) -> ServedModel:
    """The registry's loader: load the GGUF (compiling kernels) and start its scheduler."""
    model = engine.load(entry.model, n_ctx=entry.n_ctx, n_threads=entry.n_threads)
    try:
        template = _template_for(model, entry.chat_template)
        return ServedModel(model, template, name=entry.aliases[0], max_queue=entry.max_queue)
    except BaseException:
        model.close()
        raise
