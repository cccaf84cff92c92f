"""Per-model request scheduling: continuous batching on one thread; events flow back to asyncio.

Each loaded model has one scheduler thread that owns the engine. It loops: take new requests,
drop cancelled ones, then run ONE batch step (engine/batch.py): a forward pass with a decode token
for every running sequence and chunks of waiting prompts, and a sample per sequence. `n_parallel`
sequences run at once (the model's KV-cache slots); up to `max_queue` more wait, FIFO, beyond
that QueueFullError (a 503). Idle, the thread sleeps on a condition variable.

A job's life (its `state`, changed under the scheduler's lock):

    WAITING --admitted to a slot--> ACTIVE --eog / length / stop string--> DONE (Finished event)
       |                              |------step failed (forward,-----> DONE (the exception)
       |                              |      sampling)
       +--cancel()--> DONE            +------cancel()/close()----------> DONE (GenerationCancelled
       +--close()---> DONE (SchedulerClosedError)                             or its reason)

    asyncio side                           scheduler thread (one per loaded model)
    ------------                           ----------------------------------------
    submit(req) --job--> incoming list --> runner.submit(Sequence)
                 (lock + condition)        loop: drop cancelled -> runner.step() -> per sequence:
    async for ev in generation  <--------     token -> decode -> StopScanner -> TextDelta ...
          ^   (one call_soon_threadsafe       Finished (or the exception)
          |    per event loop per step)
    cancel() flags the job and wakes the thread; its sequence leaves the batch before the next
    step and its slot is free again.

The interface is request-level (`submit` -> async iterator of events, `cancel`); `n` > 1 and
prompt arrays are several submits, batched together, sharing their prompt's KV (engine/batch.py).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

import engine
from engine import batch
from engine.chat import ChatTemplate, ChatTemplateError
from engine.chat_formats import TemplateChoice, choose_template
from engine.sampling import NonFiniteLogitsError
from engine.tool_formats import ToolFormat
from engine.tool_formats import detect as detect_tool_format

from . import defaults
from .metrics import NULL_METRICS, MetricsSink

if TYPE_CHECKING:
    from .config import ModelEntry

log = logging.getLogger("modelyard.scheduler")

PROGRESS_LOG_SECONDS = 10.0  # a generation running longer logs its progress this often


# --------------------------------------------------------------------------------- requests, events

@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    params: engine.SamplingParams
    max_tokens: int                      # already capped to what the context leaves
    stop: tuple[str, ...] = ()
    logprobs: bool = False               # attach TokenInfo to deltas
    constraint: engine.Constraint | None = None  # a grammar this choice alone follows
    keep_special: bool = False           # decode control tokens too (tool-call markers)


@dataclass(frozen=True)
class TokenInfo:
    """One generated token for logprobs: its text, raw bytes, log-probability, alternatives."""
    token: int
    text: str
    bytes: bytes
    logprob: float
    top: list[tuple[str, bytes, float]] = field(default_factory=list)
    top_ids: list[int] = field(default_factory=list)  # the alternatives' token ids, as `top`


@dataclass(frozen=True)
class PromptProgress:
    """A long prompt is being read: `processed` of `total` tokens (`cached` came for free)."""
    processed: int
    total: int
    cached: int


@dataclass(frozen=True)
class TextDelta:
    text: str
    tokens: list[TokenInfo]              # empty unless logprobs were requested


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


Event = PromptProgress | TextDelta | Finished


class QueueFullError(Exception):
    """A model's queue holds `max_queue` requests already; the client should retry later."""

    def __init__(self, name: str, max_queue: int, retry_after: float = 1.0) -> None:
        super().__init__(f"model '{name}' has {max_queue} requests waiting; retry later")
        self.retry_after = retry_after


class ModelBrokenError(Exception):
    """The model cannot serve any more: its file changed under the mapping, or it produced
    non-finite logits. The registry unloads it (gateway/registry.py); a later request loads
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
        self.matched = ""  # the stop string that ended the text
        self._held: list[tuple[str, T]] = []

    def push(self, piece: str, item: T) -> tuple[str, list[T]]:
        """Add one token's text; returns the text and items now safe to release."""
        if self.stopped:
            return "", []
        self._held.append((piece, item))
        if not self.stops:
            return self.flush()
        text = "".join(p for p, _ in self._held)
        hits = [(i, s) for i, s in ((text.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            at, self.matched = min(hits, key=lambda hit: hit[0])
            return self._release(at, cut=True)
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

class JobState(Enum):
    WAITING = "waiting"      # submitted, no slot yet
    ACTIVE = "active"        # holds a slot
    DONE = "done"


class _Job:
    """One request's work, reporting back into one event loop. `state` changes under the lock."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: batch.Occupant) -> None:
        self.loop = loop
        self.work = work
        work.tag = self
        self.state = JobState.WAITING
        self.cancelled = threading.Event()
        self.cancel_reason: BaseException | None = None  # told to a consumer still listening

    def deliver(self, event: Any) -> None:
        """On the event loop: hand over one event (or exception)."""
        raise NotImplementedError


class _GenerationJob(_Job):
    work: batch.Sequence

    def __init__(self, loop: asyncio.AbstractEventLoop, request: GenerationRequest,
                 tokenizer: Any) -> None:
        super().__init__(loop, batch.Sequence(request.prompt_ids, params=request.params,
                                              max_tokens=request.max_tokens,
                                              constraint=request.constraint))
        self.request = request
        # one consumer: a deque and the future it waits on is all an asyncio.Queue did here
        self.events: deque[Event | BaseException] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.decoder = tokenizer.incremental_decoder(skip_special=not request.keep_special)
        self.scanner: StopScanner[TokenInfo | None] = StopScanner(request.stop)
        self.submitted = time.monotonic()
        self.first_token: float | None = None
        self.next_progress_log = self.submitted + PROGRESS_LOG_SECONDS

    def deliver(self, event: Any) -> None:
        self.events.append(event)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _EmbeddingJob(_Job):
    work: batch.Embedding

    def __init__(self, loop: asyncio.AbstractEventLoop, ids: list[int]) -> None:
        super().__init__(loop, batch.Embedding(list(ids)))
        self.future: asyncio.Future[np.ndarray] = loop.create_future()

    def deliver(self, event: Any) -> None:
        if not self.future.done():
            if isinstance(event, BaseException):
                self.future.set_exception(event)
            else:
                self.future.set_result(event)


def _token_text(tok: Any, token: int) -> tuple[str, bytes]:
    raw = tok.token_bytes(token)
    return raw.decode("utf-8", errors="backslashreplace"), raw


def _token_info(tok: Any, sampled: engine.Sampled) -> TokenInfo:
    text, raw = _token_text(tok, sampled.token)
    top = [(*_token_text(tok, t), lp) for t, lp in sampled.top_logprobs]
    return TokenInfo(sampled.token, text, raw, sampled.logprob, top,
                     [t for t, _ in sampled.top_logprobs])


class _Outbox:
    """Events of one scheduler iteration, handed to each event loop in one call.

    `send` then waits (at most HANDOFF_WAIT) until the loop has run a few rounds past them, so
    the chunks are on their sockets before the next forward pass starts: when the pass's threads
    fill every core, a loop waking up mid-pass preempts one of them and the rest stall at the next
    barrier (measured on 2 cores: +10-15% tokens/s with 1-16 streaming clients).
    """

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, Any]]] = defaultdict(list)

    def put(self, job: _Job, event: Any) -> None:
        self._by_loop[job.loop].append((job, event))

    def send(self) -> None:
        handed: list[threading.Event] = []
        for loop, items in self._by_loop.items():
            done = threading.Event()
            try:
                loop.call_soon_threadsafe(_deliver_all, loop, items, done)
                handed.append(done)
            except RuntimeError:  # the loop is closed (shutdown): nobody is listening
                for job, _ in items:
                    job.cancelled.set()
        self._by_loop.clear()
        for done in handed:
            done.wait(HANDOFF_WAIT)


HANDOFF_WAIT = 0.005   # seconds; bounds the wait for a busy or blocked event loop
# Loop rounds after delivery. A consumer woken in round k runs in round k + 1, after which this
# callback runs again: a stream's route task writes its chunk to the socket in round 1 (one
# choice) or 2 (several: a choice pump takes each event first, serving.py).
HANDOFF_ROUNDS = 2


def _deliver_all(loop: asyncio.AbstractEventLoop, items: list[tuple[_Job, Any]],
                 done: threading.Event, rounds: int = HANDOFF_ROUNDS) -> None:
    for job, event in items:
        job.deliver(event)
    if rounds:
        loop.call_soon(_deliver_all, loop, [], done, rounds - 1)
    else:
        done.set()


# --------------------------------------------------------------------------------- async side

class Generation:
    """The asyncio handle of one submitted generation: iterate its events, or cancel it.

    Use as `async with scheduler.submit(req) as gen: async for event in gen: ...`; leaving the
    block early (client gone, error) cancels the generation so its slot is freed.
    """

    def __init__(self, scheduler: Scheduler, job: _GenerationJob) -> None:
        self._scheduler = scheduler
        self._job = job
        self._done = False

    def cancel(self) -> None:
        self._scheduler._cancel(self._job)

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        job = self._job
        while not job.events:
            job.waiter = job.loop.create_future()
            try:
                await job.waiter
            finally:
                job.waiter = None
        event = job.events.popleft()
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
    """One thread per model runs every request in continuous batches (see the module doc)."""

    def __init__(self, model: Any, *, name: str = "model", max_queue: int = 64,
                 metrics: MetricsSink = NULL_METRICS,
                 prefill_budget: int = batch.PREFILL_BUDGET) -> None:
        self.model = model
        self.name = name
        self.max_queue = max_queue
        self.metrics = metrics
        self.runner = batch.BatchRunner(model, prefill_budget=prefill_budget)
        self.n_slots = self.runner.n_slots
        self._cond = threading.Condition()  # guards everything below, and every job's state
        self._closed = False
        self._incoming: list[_Job] = []
        self._n_waiting = 0                 # WAITING jobs not cancelled
        self._n_active = 0                  # ACTIVE jobs
        self._broken: str | None = None     # why this model must stop serving (ModelBrokenError)
        self._retryable = True              # whether loading the file again may help
        self._abort: BaseException | None = None  # end every job with this (shutdown deadline)
        self._file_changed = getattr(model, "file_changed", lambda: None)
        self._thread = threading.Thread(target=self._work, name=f"modelyard-{name}", daemon=True)
        self._thread.start()

    # -- asyncio side ------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> Generation:
        job = _GenerationJob(asyncio.get_running_loop(), request, self.model.tokenizer)
        self._enqueue(job)
        return Generation(self, job)

    async def embed(self, ids: list[int]) -> np.ndarray:
        """float32 [n_embd] for one input, computed in the batch."""
        job = _EmbeddingJob(asyncio.get_running_loop(), ids)
        self._enqueue(job)
        try:
            return await job.future
        finally:
            self._cancel(job)

    @property
    def broken(self) -> str | None:
        """Why the model stopped serving (its file changed, non-finite logits), or None."""
        return self._broken

    @property
    def queued(self) -> int:
        """Requests waiting for a slot (cancelled ones no longer count)."""
        with self._cond:
            return self._n_waiting

    @property
    def active(self) -> int:
        """Requests holding a slot."""
        with self._cond:
            return self._n_active

    def _enqueue(self, job: _Job) -> None:
        self.runner.check(job.work)  # ValueError / ContextOverflowError before anything queues
        with self._cond:
            if self._broken is not None:
                raise ModelBrokenError(self.name, self._broken, retryable=self._retryable)
            if self._closed:
                raise SchedulerClosedError(self.name)
            if self._n_waiting + self._n_active >= self.n_slots + self.max_queue:
                raise QueueFullError(self.name, self.max_queue)
            self._n_waiting += 1
            self._incoming.append(job)
            self._cond.notify()
        self.metrics.set_queue(self.name, self.queued)

    def _cancel(self, job: _Job) -> None:
        with self._cond:
            if job.cancelled.is_set() or job.state is JobState.DONE:
                return
            job.cancelled.set()
            if job.state is JobState.WAITING:  # no longer counts; the thread drops it
                job.state = JobState.DONE
                self._n_waiting -= 1
            self._cond.notify()

    def abort(self, error: BaseException) -> None:
        """End every job, waiting or running, with `error` (the thread does it next round)."""
        with self._cond:
            self._abort = error
            self._cond.notify()

    def close(self) -> None:
        """Fail waiting requests, cancel running ones, and wait for the thread to stop."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # -- scheduler thread --------------------------------------------------------------------

    def _work(self) -> None:
        runner = self.runner
        try:
            while True:
                with self._cond:
                    while not (self._closed or self._incoming or runner.busy or self._abort):
                        self._cond.wait()
                    if self._closed:
                        return
                    incoming, self._incoming = self._incoming, []
                    abort, self._abort = self._abort, None
                for job in incoming:
                    runner.submit(job.work)
                outbox = _Outbox()
                self._drop_cancelled(outbox)
                if abort is not None:
                    self._fail_all(outbox, abort)
                if runner.busy and self._broken is None:
                    self._step(outbox)
                    # What the step read came from the file: if it changed meanwhile (a page
                    # past a new end reads zeros, engine/sigbus.py), its results are garbage.
                    if (why := self._file_changed()) is not None:
                        outbox = _Outbox()
                        self._break(why)
                if self._broken is not None:
                    self._fail_all(outbox, ModelBrokenError(self.name, self._broken,
                                                            retryable=self._retryable))
                outbox.send()
                self._publish()
        except BaseException:  # a bug here must not leave requests hanging
            log.exception("scheduler of %s failed", self.name)
            raise
        finally:
            self._shut_down()

    def _drop_cancelled(self, outbox: _Outbox) -> None:
        for work in list(self.runner.occupants()):
            job: _Job = work.tag
            if job.cancelled.is_set():
                self.runner.end(work, "cancelled")
                self._done(job)
                outbox.put(job, job.cancel_reason or GenerationCancelled())

    def _break(self, why: str, retryable: bool = True) -> None:
        log.error("%s stops serving: %s", self.name, why)
        with self._cond:
            self._broken = why
            self._retryable = retryable

    def _fail_all(self, outbox: _Outbox, error: BaseException) -> None:
        with self._cond:
            leftover, self._incoming = self._incoming, []
        for work in list(self.runner.occupants()):
            self.runner.end(work, "cancelled")
            leftover.append(work.tag)
        for job in leftover:
            if job.state is not JobState.DONE:
                outbox.put(job, error)
            self._done(job)

    def _step(self, outbox: _Outbox) -> None:
        try:
            result = self.runner.step()
        except batch.StepError as exc:
            if isinstance(exc.cause, NonFiniteLogitsError):
                self._break(f"it produced non-finite logits (corrupt weights?): {exc.cause}",
                            retryable=False)
                error = ModelBrokenError(self.name, self._broken or "", retryable=False)
                for work in exc.occupants:
                    self._done(work.tag)
                    outbox.put(work.tag, error)
                return
            log.error("a step failed on %s", self.name, exc_info=exc.cause)
            for work in exc.occupants:
                self._done(work.tag)
                outbox.put(work.tag, exc.cause)
            return
        with self._cond:
            for work in result.admitted:
                job = work.tag
                if job.state is JobState.WAITING:
                    job.state = JobState.ACTIVE
                    self._n_waiting -= 1
                    self._n_active += 1
        if result.n_sequences:
            self.metrics.observe_batch(self.name, result.n_sequences)
        if result.reused_tokens:
            self.metrics.add_prompt_cache_hits(self.name, result.reused_tokens)
        for seq in result.progressed:
            if seq.prefilling or seq.prefill_steps > 1:  # read in more than one step: "long"
                outbox.put(seq.tag, PromptProgress(seq.pos, len(seq.prompt), seq.cached))
        for seq, sampled in result.sampled:
            self._on_token(seq.tag, sampled, outbox)
        for work in result.finished:
            if isinstance(work, batch.Embedding):
                outbox.put(work.tag, work.vector)
                self._done(work.tag)
            elif work.tag.state is not JobState.DONE:  # not already ended by a stop string
                self._finish(work.tag, work.finish_reason or "stop", outbox)

    def _on_token(self, job: _GenerationJob, sampled: engine.Sampled, outbox: _Outbox) -> None:
        now = time.monotonic()
        if job.first_token is None:
            job.first_token = now
        elif now >= job.next_progress_log:  # a long generation says it is still going
            job.next_progress_log = now + PROGRESS_LOG_SECONDS
            n = len(job.work.generated)
            log.info("generating on %s: %d tokens in %.0fs (%.1f tokens/s), max_tokens %d",
                     self.name, n, now - job.submitted, n / max(now - job.first_token, 1e-9),
                     job.request.max_tokens)
        info = _token_info(self.model.tokenizer, sampled) if job.request.logprobs else None
        self._send_text(job, *job.scanner.push(job.decoder.push(sampled.token), info), outbox)
        if job.scanner.stopped:
            self.runner.end(job.work, "stop")
            self._finish(job, "stop", outbox)

    def _finish(self, job: _GenerationJob, reason: str, outbox: _Outbox) -> None:
        if not job.scanner.stopped:
            self._send_text(job, *job.scanner.push(job.decoder.flush(), None), outbox)
            if job.scanner.stopped:
                reason = "stop"
            self._send_text(job, *job.scanner.flush(), outbox)
        seq = job.work
        now = time.monotonic()
        first = job.first_token if job.first_token is not None else now
        outbox.put(job, Finished(reason, len(seq.prompt), len(seq.generated), seq.cached,
                                 prompt_seconds=first - job.submitted,
                                 predicted_seconds=now - first, stop_word=job.scanner.matched))
        self._done(job)

    @staticmethod
    def _send_text(job: _GenerationJob, text: str, items: list[TokenInfo | None],
                   outbox: _Outbox) -> None:
        tokens = [t for t in items if t is not None]
        if text or tokens:
            outbox.put(job, TextDelta(text, tokens))

    def _done(self, job: _Job) -> None:
        with self._cond:
            if job.state is JobState.WAITING:
                self._n_waiting -= 1
            elif job.state is JobState.ACTIVE:
                self._n_active -= 1
            job.state = JobState.DONE

    def _publish(self) -> None:
        with self._cond:
            waiting, active = self._n_waiting, self._n_active
        self.metrics.set_queue(self.name, waiting)
        self.metrics.set_active_slots(self.name, active)

    def _shut_down(self) -> None:
        """Closing (or a failed thread): every job still here learns why; slots are freed."""
        with self._cond:
            self._closed = True
            leftover = self._incoming
            self._incoming = []
        outbox = _Outbox()
        held = list(self.runner.occupants())
        for work in held:
            self.runner.end(work, "cancelled")
        for job in [*leftover, *(w.tag for w in held)]:
            outbox.put(job, job.cancel_reason or SchedulerClosedError(self.name))
            self._done(job)
        outbox.send()
        self.runner.close()
        self._publish()


# --------------------------------------------------------------------------------- served model

class ServedModel:
    """What the registry holds for a loaded model: engine model + scheduler + chat template."""

    chat_format: str | None = None  # which template and why (chat_formats.TemplateChoice)

    def __init__(self, model: Any, template: ChatTemplate, *, name: str, max_queue: int,
                 metrics: MetricsSink = NULL_METRICS) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.n_ctx: int = model.n_ctx
        self.chat_template = template
        # what the GGUF recommends (general.sampling.*); requests fill unset fields from it
        self.sampling_defaults = defaults.from_metadata(getattr(model, "metadata", None) or {})
        self.scheduler = Scheduler(model, name=name, max_queue=max_queue, metrics=metrics)
        # Request preparation (template, tokenizing) is CPU work that must not block the event
        # loop; two threads per model, so one model's slow prompts never delay another's.
        self.prep = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"modelyard-{name}-prep")
        self._max_token_bytes: int | None = None
        self.fingerprint = _fingerprint(model, template)


    @property
    def max_token_bytes(self) -> int:
        """The longest token's text in bytes: a prompt of more than n_ctx times this many bytes
        cannot fit the context, whatever it tokenizes to (computed once)."""
        if self._max_token_bytes is None:
            tok = self.tokenizer
            texts = getattr(self.model, "metadata", {}).get("tokenizer.ggml.tokens") or []
            longest = max((len(tok.token_bytes(i)) for i in range(self.model.n_vocab)), default=1)
            longest = max([longest, *(len(str(t).encode()) for t in texts)])
            self._max_token_bytes = max(1, longest)
        return self._max_token_bytes

    @property
    def memory_bytes(self) -> int:
        return int(self.model.memory_bytes)

    @property
    def broken(self) -> str | None:
        """Why this model must stop serving, or None (the registry unloads a broken model)."""
        return self.scheduler.broken

    def abort(self, error: BaseException) -> None:
        """End every request this model runs or queues with `error` (shutdown deadline)."""
        self.scheduler.abort(error)

    def file_changed(self) -> str | None:
        """Why the model file is no longer what is mapped (a stat), or None."""
        check = getattr(self.model, "file_changed", None)
        return None if check is None else check()

    @property
    def mapped_bytes(self) -> int:
        """The part of memory_bytes another load of the same file shares (its mapping)."""
        return int(getattr(self.model, "mapped_bytes", 0))

    @property
    def queued(self) -> int:
        """Requests waiting for a slot (the registry reports it)."""
        return self.scheduler.queued

    @property
    def active(self) -> int:
        """Requests generating in a slot (the registry reports it)."""
        return self.scheduler.active

    def chat_prompt(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None, *, time_budget: float = 2.0,
                    max_chars: int = 64 * 1024 * 1024) -> list[int]:
        """Render the chat template (within its budget, engine/template_budget.py) and tokenize
        it, special tokens parsed as such. Call it on `prep`, not on the event loop."""
        text = self.chat_template.render(messages, add_generation_prompt=True, tools=tools,
                                         time_budget=time_budget, max_chars=max_chars)
        return self.text_prompt(text)

    @property
    def tool_format(self) -> ToolFormat:
        """How this model's template writes tool calls (engine/tool_formats.py), found once."""
        fmt = self.__dict__.get("_tool_format")
        if fmt is None:
            tok = self.tokenizer

            def control_token(text: str) -> int | None:
                token = tok.token_id(text)
                return token if token is not None and tok.is_special(token) else None

            fmt = self.__dict__["_tool_format"] = detect_tool_format(self.chat_template.source,
                                                                     control_token)
        return fmt

    def text_prompt(self, text: str) -> list[int]:
        """Tokenize a prompt; BOS is added when the model wants it and the text lacks it."""
        tok = self.tokenizer
        bos = self.chat_template.bos_token
        add_bos = bool(tok.add_bos) and not (bos and text.startswith(bos))
        return list(tok.encode(text, add_special=add_bos, parse_special=True))

    def close(self) -> None:
        self.prep.shutdown(wait=True, cancel_futures=True)
        self.scheduler.close()
        self.model.close()


def _fingerprint(model: Any, template: ChatTemplate) -> str:
    """OpenAI's `system_fingerprint`: changes when what shapes the outputs does (the weights
    file, the context, the template, the engine's version), so clients can tell."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("modelyard")
    except PackageNotFoundError:
        ours = "dev"
    path = getattr(model, "path", None)
    stat = path.stat() if path is not None and path.exists() else None
    parts = (ours, str(path), stat.st_size if stat else 0, stat.st_mtime_ns if stat else 0,
             getattr(model, "n_ctx", 0), getattr(template, "source", ""))
    return "fp_" + hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def _template_for(model: Any, entry: ModelEntry) -> tuple[ChatTemplate, TemplateChoice]:
    """The entry's template (engine/chat_formats.py says which wins); a file template that does
    not compile falls back to the built-in its vocabulary suggests."""
    tok = model.tokenizer
    tokens = model.metadata.get("tokenizer.ggml.tokens") or []
    choice = choose_template(model.metadata, config_template=entry.chat_template,
                             chat_format=entry.chat_format)
    try:
        template = ChatTemplate.for_model(choice.source, tokens, tok.bos_id, tok.eos_id)
    except ChatTemplateError as exc:
        if choice.origin != "gguf":
            raise  # config.py compiled it already: only the file's own can fail here
        meta = {k: v for k, v in model.metadata.items() if k != "tokenizer.chat_template"}
        fallback = choose_template(meta)
        choice = TemplateChoice(fallback.source, "built-in", fallback.name,
                                f"the file's chat template does not compile ({exc})")
        log.warning("%s: %s; using %s instead", model.path, exc, choice.describe())
        template = ChatTemplate.for_model(choice.source, tokens, tok.bos_id, tok.eos_id)
    return template, choice


def load_served_model(entry: ModelEntry, metrics: MetricsSink = NULL_METRICS) -> ServedModel:
    """The registry's loader: load the GGUF (compiling kernels) with `n_parallel` KV-cache slots
    and start its scheduler."""
    model = engine.load(entry.model, n_ctx=entry.n_ctx, n_threads=entry.n_threads,
                        n_slots=entry.n_parallel)
    try:
        template, choice = _template_for(model, entry)
        log.info("%s: chat template: %s", entry.name, choice.describe())
        served = ServedModel(model, template, name=entry.aliases[0], max_queue=entry.max_queue,
                             metrics=metrics)
        served.chat_format = choice.describe()
        return served
    except BaseException:
        model.close()
        raise
