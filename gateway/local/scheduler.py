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
Requests and events are gateway/generation/events.py's, the stop-string scanner
gateway/local/stop_strings.py's; gateway/local/served_model.py wraps a scheduler, a model and its
template into what the registry holds.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np

import engine
from engine import batch
from engine.draft import Drafter
from engine.loaded import LoadedModel, ModelTokenizer
from engine.prompt_cache import BLOCK, PromptCachePool
from engine.sampling import NonFiniteLogitsError
from gateway.generation.events import (
    Event,
    Finished,
    GenerationCancelled,
    GenerationRequest,
    ModelBrokenError,
    PromptProgress,
    QueueFullError,
    SchedulerClosedError,
    TextDelta,
    Timings,
    TokenInfo,
)
from gateway.local.arrivals import Arrivals
from gateway.local.stop_strings import StopScanner
from gateway.metrics import NULL_METRICS, MetricsSink

log = logging.getLogger("modelyard.scheduler")

# An idle scheduler waits at most this long for requests still being planned (gateway/local/
# arrivals.py), so a burst of requests is read in one step and their first tokens come together.
GATHER_WAIT = 0.010    # seconds
GATHER_POLL = 0.001    # seconds between looks at requests that ended while being planned
PROGRESS_LOG_SECONDS = 10.0  # a generation running longer logs its progress this often
MISS_TOKENS = BLOCK  # a prompt computing this many tokens or more missed the prompt cache


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
                 tokenizer: ModelTokenizer) -> None:
        super().__init__(loop, batch.Sequence(request.prompt, params=request.params,
                                              max_tokens=request.max_tokens,
                                              constraint=request.constraint,
                                              budget=request.budget,
                                              speculative=request.speculative,
                                              id_slot=request.id_slot,
                                              cache_prompt=request.cache_prompt,
                                              lora=request.lora))
        self.request = request
        # one consumer: a deque and the future it waits on is all an asyncio.Queue did here
        self.events: deque[Event | BaseException] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.decoder = tokenizer.incremental_decoder(skip_special=not request.keep_special)
        self.scanner: StopScanner[TokenInfo | None] = StopScanner(request.stop)
        self.submitted = time.monotonic()
        self.started = self.submitted  # when its slot took it (the step that admitted it began)
        self.first_token: float | None = None
        self.delivered = 0  # tokens handed to the stop-string scanner
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


def _token_text(tok: ModelTokenizer, token: int) -> tuple[str, bytes]:
    raw = tok.token_bytes(token)
    return raw.decode("utf-8", errors="backslashreplace"), raw


def _timings(job: _GenerationJob, now: float | None) -> Timings:
    """Where the job stands now (llama.cpp's per-token `timings`)."""
    now = time.monotonic() if now is None else now
    first = job.first_token if job.first_token is not None else now
    seq = job.work
    return Timings(len(seq.prompt), seq.cached, job.delivered, first - job.submitted, now - first,
                   seq.draft_n, seq.draft_accepted)


def _token_info(tok: ModelTokenizer, sampled: engine.Sampled) -> TokenInfo:
    text, raw = _token_text(tok, sampled.token)
    top = [(*_token_text(tok, t), lp) for t, lp in sampled.top_logprobs]
    return TokenInfo(sampled.token, text, raw, sampled.logprob, top,
                     [t for t, _ in sampled.top_logprobs])


class _Outbox:
    """Events of one scheduler iteration, handed to each event loop in one call.

    The next forward pass does not wait for the loop to write them: the pass's shares go to
    whichever thread is on a core (engine/kernels/pool.py), so a loop waking mid-pass costs the
    pass one core's share of time, not a stall at every barrier. Waiting (up to 5 ms, until the
    loop had written the chunks) was right for the old static split and measured 0.76-0.84x of
    not waiting with claimed shares (scripts/bench_serve.py --levels 1 8 32, 3 rounds, one run).
    """

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, Any]]] = defaultdict(list)

    def put(self, job: _Job, event: Any) -> None:
        self._by_loop[job.loop].append((job, event))

    def send(self) -> None:
        for loop, items in self._by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # the loop is closed (shutdown): nobody is listening
                for job, _ in items:
                    job.cancelled.set()
        self._by_loop.clear()


def _deliver_all(items: list[tuple[_Job, Any]]) -> None:
    for job, event in items:
        job.deliver(event)


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
        if job.request.observer is not None:
            job.request.observer.event(job.request, event)
        return event

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._done:
            self.cancel()


class Scheduler:
    """One thread per model runs every request in continuous batches (see the module doc)."""

    def __init__(self, model: LoadedModel, *, name: str = "model", max_queue: int = 64,
                 metrics: MetricsSink = NULL_METRICS,
                 prefill_budget: int = batch.PREFILL_BUDGET,
                 idle_budget: int = batch.IDLE_PREFILL_BUDGET,
                 drafts: Callable[[], Drafter | None] | None = None,
                 prompt_cache: PromptCachePool | None = None) -> None:
        self.model = model
        self.name = name
        self.max_queue = max_queue
        self.metrics = metrics
        # drafts: a drafter for each admitted request that does not opt out (speculative)
        self.runner = batch.BatchRunner(model, prefill_budget=prefill_budget,
                                        idle_budget=idle_budget, drafts=drafts,
                                        prompt_cache=prompt_cache)
        self.exclusive = threading.Lock()  # held by a step, and by a slot action between steps
        self.n_slots = self.runner.n_slots
        self._cond = threading.Condition()  # guards everything below, and every job's state
        self._closed = False
        self._incoming: list[_Job] = []
        self._n_waiting = 0                 # WAITING jobs not cancelled
        self._n_active = 0                  # ACTIVE jobs
        self._broken: str | None = None     # why this model must stop serving (ModelBrokenError)
        self._retryable = True              # whether loading the file again may help
        self._abort: BaseException | None = None  # end every job with this (shutdown deadline)
        self._file_changed = model.file_changed
        self.arrivals = Arrivals()  # requests being planned for this model (ServedModel.prepare)
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
            self.arrivals.submitted()  # under the lock: _gather sees the job and the count together
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
                    if incoming and not runner.decoding:
                        incoming += self._gather()
                for job in incoming:
                    runner.submit(job.work)
                outbox = _Outbox()
                self._drop_cancelled(outbox)
                if abort is not None:
                    self._fail_all(outbox, abort)
                if runner.busy and self._broken is None:
                    with self.exclusive:
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

    def _gather(self) -> list[_Job]:
        """With nothing decoding (so no stream waits for it), wait up to GATHER_WAIT for the
        requests still being planned, so prompts that arrive together are read in one step.
        Called holding the lock; returns the jobs that came meanwhile."""
        more: list[_Job] = []
        deadline = time.monotonic() + GATHER_WAIT
        while not (self._closed or self._abort) and self.arrivals.count():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(min(left, GATHER_POLL))
            more += self._incoming
            self._incoming = []
        return more

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
        began = time.monotonic()
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
        for work in result.admitted:
            if isinstance(work, batch.Sequence):
                self._cache_miss(work)
                work.tag.started = began
                if work.tag.request.progress:  # llama.cpp's first report: the cached part
                    outbox.put(work.tag, PromptProgress(work.cached, len(work.prompt),
                                                        work.cached))
        now = time.monotonic()
        for seq in result.progressed:
            # unasked, only a prompt read in more than one step ("long") reports its progress
            if seq.tag.request.progress or seq.prefilling or seq.prefill_steps > 1:
                outbox.put(seq.tag, PromptProgress(seq.pos, len(seq.prompt), seq.cached,
                                                   now - seq.tag.started))
        for seq, sampled in result.sampled:
            if seq.tag.state is not JobState.DONE:  # a stop string ends it mid-draft
                self._on_token(seq.tag, sampled, outbox)
        for work in result.finished:
            if isinstance(work, batch.Embedding):
                outbox.put(work.tag, work.vector)
                self._done(work.tag)
            elif work.tag.state is not JobState.DONE:  # not already ended by a stop string
                self._finish(work.tag, work.finish_reason or "stop", outbox)

    def _cache_miss(self, seq: batch.Sequence) -> None:
        """Count a prompt-cache miss (a block's worth or more of prompt computed) by its reason,
        and log where a long prompt stopped matching."""
        computed = len(seq.prompt) - seq.cached
        if computed < MISS_TOKENS or not seq.cache_prompt:
            return
        reason = seq.cache_miss or "no_entry"
        self.metrics.add_prompt_cache_miss(self.name, reason)
        if reason == "diverged" or seq.cached >= MISS_TOKENS:
            log.info("prompt cache on %s: %s at position %d of %d (%d tokens to compute)",
                     self.name, reason, seq.cached, len(seq.prompt), computed)

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
        job.delivered += 1
        info = _token_info(self.model.tokenizer, sampled) if job.request.logprobs else None
        self._send_text(job, *job.scanner.push(job.decoder.push(sampled.token), info), outbox,
                        now)
        if job.scanner.stopped:
            self.runner.end(job.work, "stop")
            del job.work.generated[job.delivered:]  # a draft's tokens past the stop string
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
        if seq.draft_n:
            self.metrics.drafted(self.name, seq.draft_n, seq.draft_accepted)
        outbox.put(job, Finished(reason, len(seq.prompt), len(seq.generated), seq.cached,
                                 prompt_seconds=first - job.submitted,
                                 predicted_seconds=now - first, stop_word=job.scanner.matched,
                                 draft_n=seq.draft_n, draft_accepted=seq.draft_accepted))
        self._done(job)

    @staticmethod
    def _send_text(job: _GenerationJob, text: str, items: list[TokenInfo | None],
                   outbox: _Outbox, now: float | None = None) -> None:
        tokens = [t for t in items if t is not None]
        if text or tokens:
            outbox.put(job, TextDelta(text, tokens, _timings(job, now) if job.request.timings
                                      else None))

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
