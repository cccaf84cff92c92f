"""The registry owns the models: acquire()/release(), loading, eviction, draining, the idle sweep.

Every configured model has a slot whose state follows gateway/fleet/lifecycle.py; this module is the
only writer. All bookkeeping runs on the event loop, so a check and the state change it leads
to happen with no `await` between them: that is what makes "concurrent requests start one load"
and "nothing is evicted while serving" hold without locks. The slow parts (loading, closing, the
memory estimate) run in worker threads so the loop keeps serving meanwhile.

Which models to evict and which are idle is decided in gateway/fleet/eviction.py; budget.py describes
the slots to that policy, and this module carries out the answer. Loads, evictions and idle unloads
are counted into an optional `MetricsSink` (gateway/metrics.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from typing import Any

from gateway.config import Config, ModelEntry, ModelNotFoundError
from gateway.fleet.eviction import Blocked, Fits, TooLarge
from gateway.fleet.lifecycle import ModelState, advance
from gateway.fleet.registry import budget
from gateway.fleet.registry.errors import ModelLoadFailedError, PinnedLoadError, RegistryBusyError
from gateway.fleet.registry.reconcile import reconcile
from gateway.fleet.registry.slots import (
    ApplyResult,
    Estimator,
    Lease,
    Loader,
    ModelRow,
    Slot,
    broken,
    engine_estimator,
    row,
    slot_key,
)
from gateway.fleet.registry.waiting import (
    estimate_memory,
    log_progress,
    wait_event,
    wait_for_change,
    wait_for_load,
    wait_task,
    wait_until,
)
from gateway.metrics import NULL_METRICS, MetricsSink
from gateway.units import format_duration, format_size

log = logging.getLogger("modelyard.registry")


ESTIMATE_AHEAD = 16  # entries whose memory estimate start() works out in the background


class Registry:
    def __init__(self, config: Config, loader: Loader, estimator: Estimator | None = None,
                 metrics: MetricsSink = NULL_METRICS):
        self._config = config
        self._loader = loader
        self._estimator = estimator or engine_estimator
        self._metrics = metrics
        self._slots: dict[str, Slot] = {slot_key(e): Slot(e) for e in config.models}
        self._retired: list[Slot] = []   # still holding memory after apply() dropped them
        self._changed = asyncio.Event()   # set (and replaced) whenever a slot changes
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        self._stopping = False            # draining for shutdown: running requests finish
        self._over_limits = False         # apply() lowered a limit and evictions are pending

    @property
    def config(self) -> Config:
        return self._config

    @property
    def closed(self) -> bool:
        """True once close() has begun: no new requests are taken."""
        return self._closed

    @property
    def accepting(self) -> bool:
        """False once shutdown or close() began: new requests are refused (RegistryBusyError)."""
        return not (self._closed or self._stopping)

    # -- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the idle sweeper and load pinned models. A pinned model that cannot load fails
        the start: PinnedLoadError names each one and why (the server must not look healthy)."""
        self._sweeper = asyncio.create_task(self._sweep_idle(), name="modelyard-idle-sweeper")
        self._spawn(self._estimate_ahead())
        errors = await asyncio.gather(*(self._preload(s.entry) for s in self._slots.values()
                                        if s.entry.pinned))
        if failed := [e for e in errors if e is not None]:
            raise PinnedLoadError(failed)

    def stop_accepting(self) -> None:
        """Shutdown begins: new requests get RegistryBusyError (503), running ones go on."""
        self._stopping = True
        self.notify()

    def in_flight(self) -> dict[str, int]:
        """Requests holding each model (by entry name), for those that have any."""
        return {s.entry.name: s.in_flight for s in self._all_slots() if s.in_flight}

    async def wait_idle(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until no request holds a model; True if none does."""
        return await self.wait_until(lambda: not self.in_flight(), timeout)

    async def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until `done()`, checked whenever something changes
        (a slot here, or what notify() is told of); True if it came."""
        return await wait_until(done, lambda: self._changed, timeout)

    def abort_running(self, error: BaseException) -> None:
        """End every request a loaded model is running or queueing with `error` (the shutdown
        deadline); their streams send it as an error event."""
        for slot in self._all_slots():
            if slot.model is not None:
                slot.model.abort(error)

    async def close(self, drain_timeout: float = 30.0) -> None:
        """Refuse new requests, let running ones finish (up to drain_timeout), unload all."""
        self._closed = True
        self.notify()  # wakes the sweeper (it stops) and every waiting request (busy)
        if self._sweeper is not None:
            await self._sweeper
        # A load runs in a thread and cannot be interrupted: let it finish, then unload it.
        loads = [s.load_task for s in self._all_slots() if s.load_task is not None]
        await asyncio.gather(*loads, return_exceptions=True)
        for slot in self._all_slots():
            if slot.state is ModelState.READY:
                self._begin_drain(slot)
        def draining() -> list[Slot]:
            return [s for s in self._all_slots() if s.state is ModelState.DRAINING]

        if not await wait_until(lambda: not draining(), lambda: self._changed, drain_timeout):
            log.warning("closing with requests still running on %s",
                        ", ".join(s.entry.name for s in draining()))
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- serving ----------------------------------------------------------------------------

    async def acquire(self, alias: str | None) -> Lease:
        """A ready model for `alias` (None: the default), counted in flight until released.

        Raises ModelNotFoundError, ModelLoadFailedError, or RegistryBusyError when the model
        could not be made ready within registry.load_timeout.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.registry.load_timeout
        while True:
            if self._closed or self._stopping:
                raise RegistryBusyError("the server is shutting down")
            # Resolved every round: apply() may have replaced the slot while we waited.
            entry = self._config.resolve(alias)
            slot = self._slots[slot_key(entry)]
            state = slot.state

            if state is ModelState.READY and (why := broken(slot.model)) is not None:
                self._break(slot, why)
                continue
            if state is ModelState.READY:
                slot.in_flight += 1
                slot.last_used = time.monotonic()
                self.notify()
                return Lease(entry=slot.entry, held=slot.model, alias=alias or entry.name,
                             _slot=slot)

            if state is ModelState.LOADING:
                assert slot.load_task is not None
                # Counted as holding the model, so a request waiting for another model cannot
                # evict it in the moment between READY and our turn to acquire it (two models
                # under max_loaded_models: 1 would otherwise swap forever, serving nobody).
                slot.awaiting_load += 1
                try:
                    error = await wait_for_load(slot, slot.load_task, deadline,
                                              self._config.registry.load_timeout)
                finally:
                    slot.awaiting_load -= 1
                if error is not None:
                    raise ModelLoadFailedError(entry.model, error)
                continue

            if state is ModelState.DRAINING:  # comes back as UNLOADED, then loads again
                await wait_for_change(self._changed, deadline, f"{entry.name} is still unloading",
                                      self._config.registry.load_timeout)
                continue

            # UNLOADED, or FAILED (the next request retries): make room, then start one load.
            if slot.estimate is None:
                estimate = await asyncio.shield(self._estimate(slot))
                if isinstance(estimate, str):  # cannot be served: fail before evicting anyone
                    slot.last_error = estimate
                    raise ModelLoadFailedError(entry.model, estimate)
                slot.estimate = estimate
                continue  # the world may have changed while we were away
            over = budget.memory_over(slot, self._all_slots(), self._config.registry)
            if over > 0 and await self._shrink_caches(over, entry.name):
                continue  # prompt caches go before any model does
            plan = budget.plan_for(slot, self._all_slots(), self._config.registry)
            if isinstance(plan, TooLarge):
                slot.last_error = plan.reason
                raise ModelLoadFailedError(entry.model, plan.reason)
            if isinstance(plan, Blocked):
                await wait_for_change(self._changed, deadline,
                                      f"cannot load {entry.name}: {plan.reason}",
                                      self._config.registry.load_timeout)
                continue
            if plan.evict:
                self._evict(plan.evict, f"(least recently used) to load {entry.name}")
                continue  # their memory is back once they are UNLOADED
            self._begin_load(slot)

    async def _shrink_caches(self, need: int, loading: str) -> bool:
        """Free up to `need` bytes of loaded models' prompt caches (their pools' budgets
        lowered, least recently used blocks dropped: gateway/local/served_model.py) before any
        model is evicted. True if some was freed."""
        freed = 0
        for s in sorted(self._all_slots(), key=lambda s: s.last_used or 0.0):
            shrink = getattr(s.model, "shrink_prompt_cache", None)
            if freed >= need or s.state is not ModelState.READY or shrink is None:
                continue
            got = int(await asyncio.to_thread(shrink, need - freed))
            if got and s.model is not None:
                freed += got
                s.memory_bytes = int(s.model.memory_bytes)
                log.info("freed %s of %s's prompt cache to load %s", format_size(got),
                         s.entry.name, loading)
        return freed > 0

    def release(self, lease: Lease) -> None:
        """End a request. Idempotent; call it on the event loop (e.g. in `finally`)."""
        if lease.released:
            return
        lease.released = True
        lease.held = None
        slot = lease._slot
        slot.in_flight -= 1
        slot.last_used = time.monotonic()
        if slot.state is ModelState.READY and (why := broken(slot.model)) is not None:
            self._break(slot, why)  # drains: unloads now if this was the last request
        elif slot.state is ModelState.DRAINING and slot.in_flight == 0:
            self._spawn(self._unload(slot))
        elif (slot.keep_alive == 0 and slot.in_flight == 0 and slot.awaiting_load == 0
              and slot.state is ModelState.READY and not slot.entry.pinned):
            log.info("unloading %s: the request asked for keep_alive 0", slot.entry.name)
            self._begin_drain(slot)
        self.notify()

    def keep_alive(self, lease: Lease, seconds: float | None) -> None:
        """A request's keep_alive (Ollama's): how long its model stays loaded once idle. None:
        the config's idle_timeout; 0: unload as soon as no request uses it; inf: never unload
        (nor evict) it, until a later request says otherwise. The latest request decides."""
        lease._slot.keep_alive = seconds

    @contextlib.asynccontextmanager
    async def lease(self, alias: str | None) -> AsyncIterator[Lease]:
        held = await self.acquire(alias)
        try:
            yield held
        finally:
            self.release(held)

    # -- reporting and reconfiguring --------------------------------------------------------

    def snapshot(self) -> list[ModelRow]:
        """Per entry: state, memory, in flight, queued, last use (unix time), load stats, last
        error; retiring instances (left the config or changed settings, still draining) too."""
        return [row(slot) for slot in self._all_slots()]

    async def wait_changed(self, timeout: float) -> None:
        """Return when a slot next changes, or after `timeout` seconds (for live views)."""
        await wait_event(self._changed, timeout)

    def apply(self, config: Config) -> ApplyResult:
        """Switch to a new (already validated) config without a restart.

        Entries are matched by model file (and alias, where several share a file; see
        reconcile.py). Same settings_key(): the loaded model stays warm and takes the new
        aliases, pinning and idle timeout. Different settings: the old instance drains and the
        new one loads on demand. Removed: drains, then unloads. Lowered limits evict idle models
        (LRU) at once, and busy ones as soon as they are done.
        """
        slots, retiring, result = reconcile(self._slots, config.models)
        for slot in retiring:
            self._retire(slot)
        self._config, self._slots = config, slots
        self._over_limits = True  # the limits may have dropped: evict idle models to fit now
        self._enforce_limits()
        self.notify()
        if self._sweeper is not None:  # started: pinned entries load now, as at start-up
            for slot in slots.values():
                if slot.entry.pinned and slot.state in (ModelState.UNLOADED, ModelState.FAILED):
                    self._spawn(self._preload(slot.entry))
        return result

    async def load(self, alias: str) -> ModelRow:
        """Load `alias`'s model now (as a request would, waiting up to load_timeout); its row."""
        async with self.lease(alias) as lease:
            slot = lease._slot
        return row(slot)

    async def unload(self, alias: str, timeout: float) -> ModelRow:
        """Drain `alias`'s model (running requests finish) and unload it; its row afterwards.

        Waits at most `timeout` seconds for the drain: the row then still says "draining". A
        pinned model stays unloaded until its next request, like any other.
        """
        entry = self._config.resolve(alias)
        slot = self._slots[slot_key(entry)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if slot.state is ModelState.LOADING and slot.load_task is not None:
                await wait_task(slot.load_task, deadline - loop.time())
                if slot.state is ModelState.LOADING:
                    break  # still loading at the deadline
                continue
            if slot.state is ModelState.READY:
                log.info("unloading %s (asked by an admin)", entry.name)
                self._begin_drain(slot)
            if slot.state is not ModelState.DRAINING or loop.time() >= deadline:
                break
            await wait_event(self._changed, deadline - loop.time())
        return row(slot)

    # -- transitions (the only writers of slot.state) ---------------------------------------

    def _begin_load(self, slot: Slot) -> None:
        slot.state = advance(slot.state, ModelState.LOADING)
        slot.memory_bytes = slot.estimate or 0  # reserved, so concurrent plans count it
        slot.load_task = asyncio.create_task(self._load(slot), name=f"load {slot.entry.name}")
        self.notify()

    async def _load(self, slot: Slot) -> str | None:
        """Load in a worker thread; returns None, or the cause of the failure."""
        entry = slot.entry
        started = time.monotonic()
        log.info("loading %s from %s (%s, n_ctx %d)", entry.name, entry.model,
                 format_size(slot.estimate or 0), entry.n_ctx)
        progress = asyncio.create_task(log_progress(entry.name, started))
        try:
            model = await asyncio.to_thread(self._loader, entry)
        except BaseException as e:  # noqa: BLE001 - everything a loader raises is a failed load
            cause = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            slot.state = advance(slot.state, ModelState.FAILED)
            slot.last_error = cause
            slot.memory_bytes = 0
            slot.load_task = None
            if slot in self._retired:
                self._retired.remove(slot)
            log.error("could not load %s (%s): %s", entry.name, entry.model, cause)
            self._metrics.model_load_failed(entry.name)
            self.notify()
            if not isinstance(e, Exception):  # cancellation, interpreter exit: not ours to eat
                raise
            return cause
        finally:
            progress.cancel()
        slot.model = model
        slot.last_error = None
        slot.broken = None
        slot.memory_bytes = int(model.memory_bytes)
        slot.load_seconds = time.monotonic() - started
        slot.load_count += 1
        slot.last_used = time.monotonic()  # an unused model idles from its load
        slot.state = advance(slot.state, ModelState.READY)
        slot.load_task = None
        log.info("loaded %s in %.1fs (%s)", entry.name, slot.load_seconds,
                 format_size(slot.memory_bytes))
        self._metrics.model_loaded(entry.name, slot.load_seconds)
        if slot.retired or self._closed:
            self._begin_drain(slot)
        self.notify()
        return None

    def _begin_drain(self, slot: Slot) -> None:
        slot.state = advance(slot.state, ModelState.DRAINING)
        if slot.in_flight == 0:
            self._spawn(self._unload(slot))
        self.notify()

    async def _unload(self, slot: Slot) -> None:
        """Close the model and drop every reference we hold, so its memory goes back."""
        model, slot.model = slot.model, None
        try:
            if model is not None:
                await asyncio.to_thread(model.close)
        except Exception:  # noqa: BLE001 - a model that fails to close is still gone for us
            log.exception("closing %s failed", slot.entry.name)
        finally:
            del model
            await asyncio.to_thread(gc.collect)  # reference cycles would keep arrays alive
            failed = slot.broken is not None
            slot.state = advance(slot.state, ModelState.FAILED if failed else ModelState.UNLOADED)
            slot.memory_bytes = 0
            if slot.retired and slot in self._retired:
                self._retired.remove(slot)
            log.info("unloaded %s", slot.entry.name)
            self.notify()

    def _break(self, slot: Slot, why: str) -> None:
        """A ready model that must stop serving: drain it (its scheduler already fails what it
        runs), unload it, and leave it FAILED with the reason; the next request loads afresh."""
        log.error("%s stops serving and unloads: %s", slot.entry.name, why)
        slot.broken = slot.last_error = why
        slot.estimate = None  # the file may have a new size
        self._begin_drain(slot)

    def _retire(self, slot: Slot) -> None:
        slot.retired = True
        if slot.state is ModelState.READY:
            self._begin_drain(slot)
        elif slot.state is ModelState.FAILED:
            slot.state = advance(slot.state, ModelState.UNLOADED)
        if slot.state in (ModelState.LOADING, ModelState.DRAINING):
            self._retired.append(slot)  # its memory counts until it is unloaded

    # -- helpers ----------------------------------------------------------------------------

    def _estimate(self, slot: Slot) -> asyncio.Future[int | str]:
        """The slot's memory estimate (estimate_memory), one at a time: a request and start()'s
        look-ahead asking together share one header read."""
        future = slot.estimating
        if future is None:
            future = slot.estimating = asyncio.ensure_future(
                estimate_memory(self._estimator, slot.entry))

            def finished(done: asyncio.Future[int | str]) -> None:
                if slot.estimating is done:
                    slot.estimating = None
            future.add_done_callback(finished)
        return future

    async def _estimate_ahead(self) -> None:
        """The first ESTIMATE_AHEAD entries' memory estimates, worked out in the background at
        start, so a first request after a restart skips that header read (SmolLM2: 27-40 ms of
        its time to first token). A file that cannot be served is left to the request, which
        reports it."""
        for slot in list(self._slots.values())[:ESTIMATE_AHEAD]:
            if self._closed or self._stopping:
                return
            if slot.estimate is None and slot.state is ModelState.UNLOADED:
                estimate = await asyncio.shield(self._estimate(slot))
                if not isinstance(estimate, str) and slot.estimate is None:
                    slot.estimate = estimate

    async def _preload(self, entry: ModelEntry) -> str | None:
        """Load a pinned model; None, or why it is not ready."""
        try:
            lease = await self.acquire(entry.aliases[0])
        except (ModelLoadFailedError, RegistryBusyError, ModelNotFoundError) as e:
            log.error("pinned model %s is not ready: %s", entry.name, e)
            return f"pinned model {entry.name} cannot load: {e}"
        self.release(lease)
        return None

    async def _sweep_idle(self) -> None:
        while not self._closed:
            changed = self._changed
            now = time.monotonic()
            for slot in budget.idle(self._all_slots(), self._config.registry, now):
                log.info("unloading %s: idle for %s", slot.entry.name,
                         format_duration(now - (slot.last_used or now)))
                self._metrics.model_idle_unloaded(slot.entry.name)
                self._begin_drain(slot)
            if self._over_limits:
                self._enforce_limits()
            deadline = budget.next_idle_time(self._all_slots(), self._config.registry)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic()) + 0.01
            await wait_event(changed, timeout)

    def _enforce_limits(self) -> None:
        """Evict idle models (LRU) until the resident ones fit the current limits.

        When models that are busy stand in the way (Blocked), nothing is evicted yet; the
        sweeper asks again on every change until they fit, so a lowered limit takes effect as
        soon as it can.
        """
        limits = self._config.registry
        plan = budget.plan_to_fit(self._all_slots(), limits)
        if isinstance(plan, TooLarge):  # pinned models alone exceed the limits: nothing to do
            log.warning("pinned models alone exceed the registry limits: %s", plan.reason)
            self._over_limits = False
        elif isinstance(plan, Fits):
            self._over_limits = bool(plan.evict)  # check once more after these are gone
            self._evict(plan.evict, f"to fit the new limits (max_loaded_models {limits.max_loaded_models}"
                        f", memory_budget {format_size(limits.memory_budget)})")

    def _evict(self, keys: Iterable[str], why: str) -> None:
        """Drain the models the policy chose (by resident key); `why` completes the log line."""
        for victim in budget.by_key(self._all_slots(), keys):
            log.info("evicting %s %s", victim.entry.name, why)
            self._metrics.model_evicted(victim.entry.name)
            self._begin_drain(victim)

    def notify(self) -> None:
        """Something changed that waiters may be watching (the router's upstreams tell it too)."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _all_slots(self) -> list[Slot]:
        return [*self._slots.values(), *self._retired]
